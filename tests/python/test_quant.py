"""Quantised fine-tuning end to end on tiny real-format Llamas, against torchao 0.11 and transformers:
- qlora: the whole NF4 model's loss equals transformers' on the checkpoint whose projections went
  through torchao's to_nf4 / get_original_weight; 2 ranks train, adapters load in peft, the results
  show the NF4 bytes per parameter;
- qat, qat-lora: 2 ranks train; `mgbench quantize` writes the int4 weights and scales torchao's
  Int8DynActInt4WeightQATQuantizer.convert gives for the trained weights (merged adapters for
  qat-lora); --fake-quant-after-steps N trains exactly as full fine-tuning for N steps;
- full: the checkpoint it writes loads in transformers, whose loss equals mgbench's on it;
- what does not combine is refused, naming the options (and the layer NF4 cannot hold).
torchao runs in a process of its own with the folder TorchTune is installed in (its torchao clashes
with peft's), as make_oracles.py runs it."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from conftest import mgbench

SHARED = os.environ.get("MGBENCH_SHARED_DATA", os.path.join(os.path.dirname(__file__), "../../../shared/data"))
TOKENIZER = os.path.join(SHARED, "llama3", "tiktoken_small.model")
ORACLES = os.environ.get("MGBENCH_ORACLE_DIR", "")
NF4_MODEL = os.path.join(ORACLES, "llama_tiny_nf4")  # hidden 256, intermediate 512: NF4 holds every projection
MODEL = os.path.join(ORACLES, "llama_tiny_2256")  # hidden 64: 64 x 64 projections NF4 cannot hold
ALPACA = os.path.join(SHARED, "text", "alpaca", "alpaca_cleaned_first5k.json")
TORCHTUNE_SITE = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "torchtune-site")
# 2 ranks x batch 2, 3 optimizer steps on alpaca rows, fp32 on the CPU.
TRAIN = ["--tokenizer", TOKENIZER, "--dataset", "alpaca", "--data", ALPACA, "--limit", "24", "--batch-size", "2",
         "--grad-accum", "1", "--max-steps", "3", "--warmup-steps", "0", "--lr-schedule", "constant",
         "--precision", "fp32", "--device", "cpu", "--max-seq-len", "256", "--progress-interval", "1000"]
LORA_TRAIN = [*TRAIN, "--lora-rank", "4"]  # --lora-* only with --finetune lora (full, qat: refused)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def need(path):
    if not os.path.isdir(path):
        pytest.skip(f"oracle model {path} not found (needs transformers: tests/python/make_oracles.py)")
    if not os.path.exists(TOKENIZER):
        pytest.skip("no tiktoken_small.model")


def torchao(script, *args):
    """Runs script (Python source) with torchao 0.11 importable; returns its stdout."""
    if not os.path.isdir(os.path.join(TORCHTUNE_SITE, "torchao")):
        pytest.skip(f"torchao not installed in {TORCHTUNE_SITE} (scripts/install-deps.sh)")
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=TORCHTUNE_SITE), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def eval_loss(model, *extra):
    """mgbench's --eval-only loss (per target token) over alpaca rows, 2 ranks."""
    with tempfile.TemporaryDirectory() as results:  # not the default outputs/ under the caller's directory
        proc = mgbench("llm", "--model", model, *LORA_TRAIN, "--eval-only", *extra, "--results", f"{results}/r.h5",
                       np=2, check=True)
    return float(proc.stdout.split("eval loss:")[1].split()[0])


_NF4_ROUND_TRIP = r"""
import json, os, shutil, sys
import torch
from safetensors.torch import load_file, save_file
from torchao.dtypes.nf4tensor import to_nf4
src, dst, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
os.makedirs(dst, exist_ok=True)
tensors = load_file(os.path.join(src, "model.safetensors"))
done = 0
for key, w in tensors.items():
    if key.startswith("model.layers.") and key.split(".")[-2] in names:
        tensors[key] = to_nf4(w, 64, 256).get_original_weight().contiguous()
        done += 1
save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
shutil.copy(os.path.join(src, "config.json"), dst)
print(done)
"""


def test_qlora_model_loss_equals_the_dense_model_over_torchaos_nf4_weights(tmp_path):
    need(NF4_MODEL)
    # The dense checkpoint whose every projection is torchao's NF4 round trip.
    rounded = tmp_path / "nf4_round_trip"
    assert int(torchao(_NF4_ROUND_TRIP, NF4_MODEL, rounded, ",".join(PROJECTIONS))) == 2 * 7
    qlora = eval_loss(NF4_MODEL, "--recipe", "qlora")
    dense_rounded = eval_loss(rounded)  # the dense path, equal to transformers' (test_llm.py)
    dense = eval_loss(NF4_MODEL)
    # NF4 changes the model (by ~1e-3 here) and mgbench's NF4 model is torchao's NF4 model.
    assert abs(qlora - dense_rounded) < 1e-5, (qlora, dense_rounded, dense)
    assert abs(qlora - dense) > 1e-4, (qlora, dense)
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    # And the NF4 weights are in the checkpoint transformers reads.
    model = transformers.LlamaForCausalLM.from_pretrained(rounded, dtype=torch.float32)
    w = model.model.layers[0].self_attn.q_proj.weight
    assert len(torch.unique(w[0, :64])) <= 16  # one 64-block: at most the 16 NF4 codes times its scaler


def test_qlora_trains_on_two_ranks_and_exports_adapters_peft_loads(tmp_path):
    need(NF4_MODEL)
    h5py = pytest.importorskip("h5py")
    results, out = tmp_path / "q.h5", tmp_path / "adapter"
    for recipe in ("lora", "qlora"):
        mgbench("llm", "--recipe", recipe, "--model", NF4_MODEL, *LORA_TRAIN, "--lr", "1e-3", "--results", results,
                "--run-name", recipe, *(["--output-dir", out] if recipe == "qlora" else []), np=2, check=True)
    with h5py.File(results, "r") as f:
        runs = {run.attrs["run_name"]: run for run in f["runs"].values()}
        lora, qlora = runs["lora"], runs["qlora"]
        assert qlora["status"][0] == b"completed" and qlora.attrs["recipe"] == "qlora"
        assert qlora.attrs["quantize_base"] == "nf4" and lora.attrs["quantize_base"] == "none"
        # Same adapters trained: only the frozen base's storage differs.
        assert qlora.attrs["trainable_parameters"] == lora.attrs["trainable_parameters"]
        assert qlora.attrs["model_parameters"] == lora.attrs["model_parameters"]
        # fp32 weights: 32 bits a parameter; NF4 projections 4 + 8/64 + 32/(64*256) bits (torchao's
        # layout), the embeddings, norms and head stay fp32.
        params = qlora.attrs["model_parameters"]
        proj = 2 * (4 * 256 * 256 + 3 * 256 * 512)
        nf4_bytes = proj * (0.5 + 1 / 64 + 4 / (64 * 256)) + 4 * (params - proj)
        assert lora.attrs["weight_bytes_per_parameter"] == pytest.approx(4.0)
        assert qlora.attrs["weight_bytes_per_parameter"] == pytest.approx(nf4_bytes / params, rel=1e-3)
        for r in (0, 1):
            steps = qlora[f"rank_{r}"]["steps"][:]
            assert len(steps) == 3 and np.isfinite(steps["loss"]).all()
        # The NF4 model is a slightly different model: the losses differ, a little.
        ql, ll = qlora["rank_0"]["steps"]["loss"][:], lora["rank_0"]["steps"]["loss"][:]
        assert (ql != ll).all() and np.abs(ql - ll).max() < 0.05 * ll.max(), (ql, ll)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 4 and not (out / "model.safetensors").exists()  # base weights are not exported
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    base = transformers.LlamaForCausalLM.from_pretrained(NF4_MODEL, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, str(out))
    assert any(p.abs().sum() > 0 for k, p in model.named_parameters() if "lora_B" in k)
    report = mgbench("report", "--csv", results, check=True).stdout.splitlines()
    header = report[0].split(",")
    assert "peak_memory_mib" in header and "weight_bytes_per_param" in header, header
    rows = [dict(zip(header, line.split(","))) for line in report[1:3]]
    assert {row["recipe"] for row in rows} == {"lora", "qlora"}
    by = {row["recipe"]: float(row["weight_bytes_per_param"]) for row in rows}
    assert by["lora"] == 4.0 and by["qlora"] == pytest.approx(nf4_bytes / params, abs=5e-4), by


_CONVERT = r"""
import json, os, sys
import torch
from safetensors.torch import load_file
from torchao.quantization.qat import Int8DynActInt4WeightQATQuantizer
trained, adapter, converted = sys.argv[1], sys.argv[2], sys.argv[3]
qat = json.load(open(os.path.join(adapter or trained, "qat_config.json")))
weights = load_file(os.path.join(trained, "model.safetensors"))
if adapter:  # peft's merge: W + (B @ A) * alpha / r
    config = json.load(open(os.path.join(adapter, "adapter_config.json")))
    lora = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    for name in qat["linears"]:
        a, b = lora[f"base_model.model.{name}.lora_A.weight"], lora[f"base_model.model.{name}.lora_B.weight"]
        weights[f"{name}.weight"] = weights[f"{name}.weight"] + (b @ a) * (config["lora_alpha"] / config["r"])
ours = load_file(os.path.join(converted, "model.safetensors"))
report = {}
for name in qat["linears"]:
    w = weights[f"{name}.weight"]
    model = torch.nn.Sequential(torch.nn.Linear(w.shape[1], w.shape[0], bias=False))
    model[0].weight = torch.nn.Parameter(w.clone())
    quantizer = Int8DynActInt4WeightQATQuantizer(groupsize=qat["group_size"])
    linear = quantizer.convert(quantizer.prepare(model))[0]
    packed = ours[f"{name}.qweight"]
    high, low = (packed >> 4).to(torch.int8), (packed & 15).to(torch.int8)
    values = torch.stack([high, low], -1).reshape(packed.shape[0], -1)
    values = torch.where(values > 7, values - 16, values)
    report[name] = [torch.equal(values, linear.weight.to(torch.int8)), torch.equal(ours[f"{name}.scales"],
                    linear.scales.float()), torch.equal(ours[f"{name}.zeros"], linear.zeros.float())]
print(json.dumps(report))
"""


@pytest.mark.parametrize("recipe", ["qat", "qat-lora"])
def test_qat_trains_on_two_ranks_and_quantize_writes_torchaos_int4(tmp_path, recipe):
    need(MODEL)
    h5py = pytest.importorskip("h5py")
    results, out, q = tmp_path / "qat.h5", tmp_path / "trained", tmp_path / "int4"
    mgbench("llm", "--recipe", recipe, "--model", MODEL, *(TRAIN if recipe == "qat" else LORA_TRAIN), "--lr", "1e-3",
            "--qat-group-size", "32", "--results", results, "--output-dir", out, np=2, check=True)
    with h5py.File(results, "r") as f:
        (run,) = f["runs"].values()
        assert run["status"][0] == b"completed" and run.attrs["recipe"] == recipe
        assert run.attrs["fake_quant"] == "8da4w" and run.attrs["qat_group_size"] == 32
        # Full QAT: the 14 projections and the head (in-features 64); qat-lora: the 12 adapted ones.
        assert run.attrs["fake_quantized_linears"] == (15 if recipe == "qat" else 12)
    qat_config = json.loads((out / "qat_config.json").read_text())
    assert qat_config["scheme"] == "8da4w" and qat_config["group_size"] == 32
    assert len(qat_config["linears"]) == (15 if recipe == "qat" else 12)
    args = ["--model", out] if recipe == "qat" else ["--model", MODEL, "--adapter", out]
    proc = mgbench("quantize", *args, "--output", q, check=True)
    assert "to int4 (groups of 32)" in proc.stdout, proc.stdout
    config = json.loads((q / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "8da4w"
    report = json.loads(torchao(_CONVERT, out if recipe == "qat" else MODEL, out if recipe == "qat-lora" else "", q))
    assert len(report) == len(qat_config["linears"])
    assert all(all(checks) for checks in report.values()), report
    # The output is no input: into the trained directory, the int4 values overwrote its weights.
    trained = out / ("model.safetensors" if recipe == "qat" else "adapter_model.safetensors")
    before = trained.read_bytes()
    same = mgbench("quantize", *args, "--output", out)
    assert same.returncode == 2 and "the trained weights would be overwritten" in same.stderr, same.stderr
    assert trained.read_bytes() == before
    # The output as --model again: named as quantized already (was: "tensor ... is missing").
    again = mgbench("quantize", "--model", q, "--output", tmp_path / "q2")
    assert again.returncode == 1 and f"--model '{q}' is quantized already" in again.stderr, again.stderr
    if recipe == "qat":
        # Full fine-tuning into the same --output-dir: the QAT run's qat_config.json no longer describes the
        # model (quantize took it for a QAT one), so it goes.
        mgbench("llm", "--recipe", "full", "--model", MODEL, *TRAIN, "--results", results, "--output-dir", out,
                check=True)
        assert not (out / "qat_config.json").exists()
        # A sharded checkpoint's index in the destination would shadow the model.safetensors written there.
        sharded = tmp_path / "sharded"
        sharded.mkdir()
        (sharded / "model.safetensors.index.json").write_text('{"weight_map": {}}')
        shadowed = mgbench("llm", "--recipe", "full", "--model", MODEL, *TRAIN, "--results", results,
                           "--output-dir", sharded)
        assert shadowed.returncode != 0 and "model.safetensors.index.json" in shadowed.stderr, shadowed.stderr
        shadowed = mgbench("quantize", "--model", out if recipe == "qat" else MODEL, "--output", sharded)
        assert shadowed.returncode == 2 and "shadowed by the old shards" in shadowed.stderr, shadowed.stderr


def test_quantize_refuses_what_is_not_a_qat_checkpoint(tmp_path):
    need(MODEL)
    proc = mgbench("quantize", "--model", MODEL, "--output", tmp_path / "q")
    assert proc.returncode == 1 and "qat_config.json' not found" in proc.stderr, proc.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "qat_config.json").write_text(json.dumps({"scheme": "8da4w", "group_size": 48,
                                                     "linears": ["model.layers.0.self_attn.q_proj"]}))
    proc = mgbench("quantize", "--model", MODEL, "--adapter", bad, "--output", tmp_path / "q")
    assert proc.returncode == 1 and "adapter_config.json" in proc.stderr, proc.stderr
    proc = mgbench("quantize", "--output", tmp_path / "q")
    assert proc.returncode == 2 and "--model" in proc.stderr, proc.stderr
    # A qat_config.json naming a layer the model lacks, or a group that does not divide its input.
    model = tmp_path / "model"
    shutil.copytree(MODEL, model)
    for linears, group, needle in ((["model.layers.9.self_attn.q_proj"], 32, "'model.layers.9.self_attn.q_proj' is not"),
                                   (["model.layers.0.mlp.down_proj"], 48, "not a multiple of group_size 48"),
                                   (["model.layers.0.mlp.up_proj"] * 2, 32, "qat_config.json': \"linears\" names layer "
                                                                            "'model.layers.0.mlp.up_proj' twice")):
        (model / "qat_config.json").write_text(json.dumps({"scheme": "8da4w", "group_size": group, "linears": linears}))
        proc = mgbench("quantize", "--model", model, "--output", tmp_path / "q")
        assert proc.returncode == 1 and needle in proc.stderr, proc.stderr
    assert not (tmp_path / "q").exists()  # nothing written for a refused conversion


def test_fake_quant_after_steps_trains_as_full_finetuning_until_then(tmp_path):
    need(MODEL)
    safetensors = pytest.importorskip("safetensors.numpy")
    trained, warned = {}, {}
    qat = ["--recipe", "qat", "--qat-group-size", "32"]
    for name, args in {"full": ["--recipe", "full"],
                       "qat_after_3": [*qat, "--fake-quant-after-steps", "3"],
                       "qat_after_2": [*qat, "--fake-quant-after-steps", "2"]}.items():
        out = tmp_path / name
        proc = mgbench("llm", "--model", MODEL, *TRAIN, "--lr", "1e-3", "--results",
                       tmp_path / "r.h5", "--output-dir", out, *args, np=2, check=True)
        trained[name] = safetensors.load_file(str(out / "model.safetensors"))
        warned[name] = proc.stderr.count("trains without fake quantisation throughout")
    # A switch at or past the run's last step is said (once, rank 0): the run never fake-quantises.
    assert warned == {"full": 0, "qat_after_3": 1, "qat_after_2": 0}, warned
    keys = sorted(trained["full"])
    assert all(np.array_equal(trained["full"][k], trained["qat_after_3"][k]) for k in keys)
    assert not all(np.array_equal(trained["full"][k], trained["qat_after_2"][k]) for k in keys)


def test_full_finetune_checkpoint_loads_in_transformers_with_the_same_loss(tmp_path):
    need(MODEL)
    out = tmp_path / "full"
    mgbench("llm", "--recipe", "full", "--model", MODEL, *TRAIN, "--lr", "1e-3", "--results", tmp_path / "r.h5",
            "--output-dir", out, np=2, check=True)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    base = transformers.LlamaForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    model, loading = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32, output_loading_info=True)
    # Every weight from the file (transformers fills a missing one at random and only warns).
    assert not any(loading[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), loading
    # The architecture's settings are the base's (a wrong rope_theta or rms_norm_eps loads silently).
    exported, original = model.config.to_dict(), base.config.to_dict()
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "rope_theta", "rope_scaling", "rms_norm_eps",
                "tie_word_embeddings", "max_position_embeddings", "bos_token_id", "eos_token_id"):
        assert exported.get(key) == original.get(key), (key, exported.get(key), original.get(key))
    moved = [name for name, p in model.named_parameters()
             if not torch.equal(p, dict(base.named_parameters())[name])]
    assert len(moved) == len(list(base.parameters()))  # every parameter trained
    # transformers computes on the export the loss mgbench computes on it.
    from test_llm import reference_loss
    texts = [row["output"] for row in json.load(open(ALPACA, encoding="utf-8"))[:8]]
    data = tmp_path / "text.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    proc = mgbench("llm", "--model", out, "--tokenizer", TOKENIZER, "--dataset", "text", "--data", data,
                   "--precision", "fp32", "--eval-only", "--batch-size", "2", "--results", tmp_path / "e.h5", np=1,
                   check=True)
    ours = float(proc.stdout.split("eval loss:")[1].split()[0])
    assert abs(ours - reference_loss(model.eval(), texts)) < 1e-4, ours
    # The trained model learnt the rows it saw.
    assert eval_loss(str(out)) < eval_loss(MODEL)


@pytest.mark.parametrize("args, needle", [
    (["--recipe", "qlora", "--finetune", "full"], "--quantize-base nf4: expected --finetune lora"),
    (["--recipe", "qlora", "--fake-quant", "8da4w"], "--quantize-base nf4 with --fake-quant 8da4w"),
    (["--recipe", "lora", "--fake-quant-after-steps", "5"], "--fake-quant-after-steps '5': only with --fake-quant"),
    (["--recipe", "dpo", "--finetune", "full"], "--finetune full: the dpo recipe needs --finetune lora"),
    (["--recipe", "qat", "--qat-group-size", "0"], "--qat-group-size '0': expected >= 2"),
])
def test_options_that_do_not_combine_exit_2(args, needle):
    proc = mgbench("llm", "--data", "x.json", *args)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr


def test_layers_nf4_or_the_group_cannot_hold_are_named_on_every_rank(tmp_path):
    need(MODEL)
    # hidden 64: a 64 x 64 projection has 4096 elements, torchao's NF4 needs a multiple of 16384.
    proc = mgbench("llm", "--recipe", "qlora", "--model", MODEL, *LORA_TRAIN, "--results", tmp_path / "r.h5", np=2,
                   timeout=120)
    assert proc.returncode != 0 and "16384" in proc.stderr and "q_proj" in proc.stderr, proc.stderr
    # qat-lora refuses an adapted linear whose in-features the group does not divide (64 % 48).
    proc = mgbench("llm", "--recipe", "qat-lora", "--model", MODEL, *LORA_TRAIN, "--qat-group-size", "48", "--results",
                   tmp_path / "r.h5", np=2, timeout=120)
    assert proc.returncode != 0 and "48" in proc.stderr and "proj" in proc.stderr, proc.stderr
    # qat with torchao's default group (256) over in-features of 64 and 128: nothing to fake-quantise. It ran as
    # plain full fine-tuning, exit 0, and wrote a qat_config.json that `mgbench quantize` then refused.
    out = tmp_path / "qat"
    proc = mgbench("llm", "--recipe", "qat", "--model", MODEL, *TRAIN, "--output-dir", out, "--results",
                   tmp_path / "r.h5", np=2, timeout=120)
    assert proc.returncode != 0 and "--qat-group-size 256: divides the in-features of none" in proc.stderr, proc.stderr
    assert not (out / "qat_config.json").exists()
