"""TorchTune 0.6.1's single-device recipes, run as mgbench's LLM peer on the same device, model shape,
rows, batch, precision and schedule (issue 47, item 1).

    peer_torchtune.py --recipe lora|qlora|dpo|full --model llama3-8b|...|HF_DIR --init random|checkpoint
        --tokenizer tokenizer.model --dataset alpaca|stack_exchange_paired --data FILE [options] --out FILE

One run of TorchTune's own recipe class (recipes/lora_finetune_single_device.py,
lora_dpo_single_device.py, full_finetune_single_device.py: its model builders, its data sets and
collate functions, its loop, loss, optimizer, compile and activation checkpointing), configured
from the command line in mgbench's option names. Three things differ from `tune run` and none is
inside a step: the recipe's `load_checkpoint` returns randomly initialised weights with `--init
random` (mgbench's `--init random`; TorchTune has no such option), its end-of-epoch checkpoint is not
written, and its metric logger is `StepClock` below. Data files load through Hugging Face `datasets`
as TorchTune's do (`source="json"`), offline.

Appends one JSON line to --out: the recipe's own metric (`tokens_per_second_per_gpu`, what its
metric logger reports: label tokens for SFT, padded positions for DPO; and the tokens it counted
each step, that rate times its step time) and, over the same timed
steps (the first --warmup-steps-excluded left out), the wall time between the recipe's per-step log
calls (each after the step's `loss.item()`, a device sync), the real tokens (not padding; DPO: chosen
and rejected), the positions computed, and the model FLOPs of those steps counted by mgbench's
formula (modules/train/recipes/llama_finetune.cpp `flops_of`: 4 FLOP per matmul parameter and position
for LoRA / QLoRA, 6 for full, plus 6 x layers x heads x head_dim per attended pair; DPO 1.5x), so
`tokens_per_s` and `mfu` mean on this side what they mean in mgbench's results.
Exits 2 naming the option on bad input; needs TorchTune 0.6.1, torchao, omegaconf, torchdata and
Hugging Face datasets importable (scripts/install-deps.sh puts them in the venv's torchtune-site)."""
import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from itertools import accumulate
from pathlib import Path

# mgbench's presets and TorchTune's builders of the same shapes (prefix: "", "lora_" or "qlora_").
PRESETS = {
    "llama3-8b": "torchtune.models.llama3.{}llama3_8b",
    "llama3.1-8b": "torchtune.models.llama3_1.{}llama3_1_8b",
    "llama3.2-1b": "torchtune.models.llama3_2.{}llama3_2_1b",
    "llama3.2-3b": "torchtune.models.llama3_2.{}llama3_2_3b",
}
# --recipe -> (the recipe file under torchtune's recipes/, its class, the builders' prefix)
RECIPES = {
    "lora": ("lora_finetune_single_device", "LoRAFinetuneRecipeSingleDevice", "lora_"),
    "qlora": ("lora_finetune_single_device", "LoRAFinetuneRecipeSingleDevice", "qlora_"),
    "dpo": ("lora_dpo_single_device", "LoRADPORecipeSingleDevice", "lora_"),
    "full": ("full_finetune_single_device", "FullFinetuneRecipeSingleDevice", ""),
}
DATASETS = {"alpaca": "torchtune.datasets.alpaca_dataset",
            "stack_exchange_paired": "torchtune.datasets.stack_exchange_paired_dataset"}
PRECISIONS = ("bf16", "fp32")  # TorchTune's `dtype` names, as mgbench's --precision
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "output_proj", "mlp")


def fail(message):
    print(f"peer_torchtune.py: {message}", file=sys.stderr)
    sys.exit(2)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", choices=sorted(RECIPES), default="lora")
    p.add_argument("--model", default="llama3-8b", help="a preset (" + ", ".join(PRESETS) + ") or an HF checkpoint dir")
    p.add_argument("--init", choices=("checkpoint", "random"), default="checkpoint")
    p.add_argument("--tokenizer", required=True, help="Llama 3 tokenizer.model")
    p.add_argument("--dataset", choices=sorted(DATASETS), default="alpaca")
    p.add_argument("--data", required=True, help="the dataset's .json / .jsonl file")
    p.add_argument("--limit", type=int, default=0, help="the first N rows (0: all)")
    p.add_argument("--batch-size", type=int, default=2, help="samples (packed: packs; dpo: pairs) per micro-batch")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--max-steps", type=int, required=True, help="optimizer steps")
    p.add_argument("--max-seq-len", type=int, default=0, help="truncation (0: none); with --padding none the pack length")
    p.add_argument("--padding", choices=("pad", "none"), default="pad", help="none: TorchTune's packed=True")
    p.add_argument("--precision", choices=sorted(PRECISIONS), default="bf16")
    p.add_argument("--compile", choices=("true", "false"), default="false")
    p.add_argument("--activation-checkpointing", choices=("true", "false"), default="false")
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-alpha", type=float, default=16.0)
    p.add_argument("--lora-targets", default="q_proj,v_proj,output_proj,mlp")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--lr-schedule", choices=("cosine", "constant"), default="cosine",
                   help="cosine: TorchTune's get_cosine_schedule_with_warmup; constant: none (its full recipe's default)")
    p.add_argument("--warmup-steps", type=int, default=100, help="the cosine schedule's linear warm-up")
    p.add_argument("--shuffle", choices=("true", "false"), default="true")
    p.add_argument("--train-on-input", action="store_true")
    p.add_argument("--warmup-steps-excluded", type=int, default=2, help="steps left out of the timing (>= 1)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--run-name", default="")
    p.add_argument("--out", required=True, help="JSON lines file the run's line is appended to")
    p.add_argument("--dry-run", action="store_true", help="check the options and the configuration; run nothing")
    a = p.parse_args(argv)
    checks = [(a.batch_size >= 1, "--batch-size: expected >= 1"), (a.grad_accum >= 1, "--grad-accum: expected >= 1"),
              (a.max_steps > a.warmup_steps_excluded >= 1,
               "--warmup-steps-excluded: expected >= 1 and below --max-steps (the first step has no start to time from)"),
              (a.limit >= 0, "--limit: expected >= 0"), (a.max_seq_len >= 0, "--max-seq-len: expected >= 0"),
              (a.padding == "pad" or a.max_seq_len > 0, "--padding none: TorchTune packs to --max-seq-len; give one"),
              (a.padding == "pad" or a.recipe != "dpo", "--padding none: TorchTune's DPO recipe has no packing"),
              (a.lr_schedule == "cosine" or a.recipe == "full",
               f"--lr-schedule constant: TorchTune's {a.recipe} recipe always has a scheduler; only full runs without"),
              (a.lr_schedule == "cosine" or a.warmup_steps == 0, "--lr-schedule constant: no warm-up; --warmup-steps 0"),
              ((a.recipe == "dpo") == (a.dataset == "stack_exchange_paired"),
               f"--dataset {a.dataset}: --recipe dpo takes stack_exchange_paired, the others alpaca"),
              (a.model in PRESETS or (Path(a.model) / "config.json").is_file(),
               f"--model {a.model}: expected a preset ({', '.join(PRESETS)}) or a directory with config.json"),
              (a.init == "random" or a.model not in PRESETS, f"--model {a.model}: a preset has no weights; --init random"),
              (a.init == "random" or a.model in PRESETS or any(Path(a.model).glob("*.safetensors")),
               f"--model {a.model}: no *.safetensors to load (--init checkpoint)"),
              (Path(a.tokenizer).is_file(), f"--tokenizer {a.tokenizer}: no such file"),
              (Path(a.data).is_file(), f"--data {a.data}: no such file")]
    targets = a.lora_targets.split(",")
    checks.append((all(t in LORA_TARGETS for t in targets), f"--lora-targets {a.lora_targets}: expected of {LORA_TARGETS}"))
    for ok, message in checks:
        if not ok:
            fail(message)
    return a


def model_config(a):
    """The recipe's `model` section: TorchTune's builder of --model's shape, with LoRA's settings."""
    prefix = RECIPES[a.recipe][2]
    targets = a.lora_targets.split(",")
    lora = {"lora_attn_modules": [t for t in targets if t != "mlp"], "apply_lora_to_mlp": "mlp" in targets,
            "apply_lora_to_output": False, "lora_rank": a.lora_rank, "lora_alpha": a.lora_alpha, "lora_dropout": 0.0}
    if a.model in PRESETS:
        section = {"_component_": PRESETS[a.model].format(prefix)}
    else:
        hf = json.loads((Path(a.model) / "config.json").read_text())
        unlike = {"tie_word_embeddings": hf.get("tie_word_embeddings", False), "rope_scaling": hf.get("rope_scaling"),
                  "head_dim": hf.get("head_dim", hf["hidden_size"] // hf["num_attention_heads"])
                  != hf["hidden_size"] // hf["num_attention_heads"]}
        for key, value in unlike.items():  # what TorchTune's generic llama3 builder cannot take from a config.json
            if value:
                fail(f"--model {a.model}: config.json's {key} ({hf.get(key)}) is not what TorchTune's generic llama3 "
                     "builder builds (untied, no RoPE scaling, head_dim = hidden / heads); use a preset")
        section = {"_component_": "torchtune.models.llama3." + ("llama3" if not prefix else "lora_llama3"),
                   "vocab_size": hf["vocab_size"], "num_layers": hf["num_hidden_layers"],
                   "num_heads": hf["num_attention_heads"], "num_kv_heads": hf["num_key_value_heads"],
                   "embed_dim": hf["hidden_size"], "intermediate_dim": hf["intermediate_size"],
                   "max_seq_len": hf.get("max_position_embeddings", 8192), "norm_eps": hf.get("rms_norm_eps", 1e-5),
                   "rope_base": int(hf.get("rope_theta", 500000))}
        if prefix == "qlora_":
            section["quantize_base"] = True
    if prefix:
        section.update(lora)
    return section


def recipe_config(a, out_dir):
    """TorchTune's config for the run, as its YAML files would give it (configs/llama3/8B_lora_single_device.yaml's
    keys), from the command line."""
    from omegaconf import OmegaConf
    dataset = {"_component_": DATASETS[a.dataset], "source": "json", "data_files": a.data,
               "split": f"train[:{a.limit}]" if a.limit else "train", "train_on_input": a.train_on_input}
    if a.recipe != "dpo":
        dataset["packed"] = a.padding == "none"
    checkpointer = {"_component_": "torchtune.training.FullModelHFCheckpointer", "checkpoint_dir": a.model,
                    "checkpoint_files": sorted(p.name for p in Path(a.model).glob("*.safetensors")) or ["none"],
                    "model_type": "LLAMA3", "output_dir": out_dir, "recipe_checkpoint": None}
    cfg = {
        "output_dir": out_dir, "model": model_config(a),
        "tokenizer": {"_component_": "torchtune.models.llama3.llama3_tokenizer", "path": a.tokenizer,
                      "max_seq_len": a.max_seq_len or None},
        "checkpointer": checkpointer, "resume_from_checkpoint": False, "save_adapter_weights_only": True,
        "dataset": dataset, "seed": a.seed, "shuffle": a.shuffle == "true", "batch_size": a.batch_size,
        "optimizer": {"_component_": "torch.optim.AdamW", "fused": a.device.startswith("cuda"),
                      "weight_decay": a.weight_decay, "lr": a.lr},
        "lr_scheduler": {"_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
                         "num_warmup_steps": a.warmup_steps} if a.lr_schedule == "cosine" else None,
        "loss": {"_component_": "torchtune.rlhf.loss.DPOLoss" if a.recipe == "dpo"
                 else "torchtune.modules.loss.CEWithChunkedOutputLoss"},
        "epochs": 1, "max_steps_per_epoch": a.max_steps, "gradient_accumulation_steps": a.grad_accum,
        "clip_grad_norm": None, "compile": a.compile == "true", "optimizer_in_bwd": False,
        "metric_logger": {"_component_": "torchtune.training.metric_logging.StdoutLogger"},
        "log_every_n_steps": 1, "log_peak_memory_stats": False, "device": a.device, "dtype": a.precision,
        "enable_activation_checkpointing": a.activation_checkpointing == "true", "enable_activation_offloading": False,
        "profiler": {"_component_": "torchtune.training.setup_torch_profiler", "enabled": False},
    }
    return OmegaConf.create(cfg)


def load_recipe(a):
    """TorchTune's recipe class for --recipe, from the installed package's recipes/ folder (not an importable
    package: loaded by path), subclassed for what differs outside the steps (the module's docstring)."""
    import torchtune
    folder = Path(torchtune.__file__).resolve().parent.parent / "recipes"
    module_name, class_name, _ = RECIPES[a.recipe]
    path = folder / f"{module_name}.py"
    if not path.is_file():
        fail(f"no {path}: TorchTune's recipes are installed beside its package (pip's torchtune wheel has them)")
    spec = importlib.util.spec_from_file_location(f"torchtune_recipe_{module_name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    base = getattr(module, class_name)

    class Peer(base):
        def load_checkpoint(self, cfg_checkpointer):
            if a.init == "checkpoint":
                return super().load_checkpoint(cfg_checkpointer)
            return {"model": random_weights(a, self._dtype, self._device)}

        def save_checkpoint(self, epoch):  # after the timed steps; nothing of the run is kept
            pass

    return Peer


def base_config(a):
    """The `model` section of --model's base (no adapters): what --init random initialises."""
    from omegaconf import OmegaConf
    return OmegaConf.create(model_config(argparse.Namespace(**{**vars(a), "recipe": "full"})))


def random_weights(a, dtype, device):
    """A base model of --model's shape initialised by TorchTune's builder on the device (as mgbench's --init random
    initialises its own): its state dict, which the recipe loads as it would a checkpoint's."""
    import torch
    from torchtune import config, training
    torch.manual_seed(a.seed)
    with training.set_default_dtype(dtype), device:
        base = config.instantiate(base_config(a))
    return base.state_dict()


def check_on_meta(a, cfg):
    """--dry-run: the recipe's model and the random base built on the meta device (no memory), the base loaded into
    the model as the recipe loads a checkpoint, and for LoRA TorchTune's own check of what was missing."""
    import torch
    from torchtune import config
    from torchtune.modules.peft import validate_missing_and_unexpected_for_lora
    with torch.device("meta"):
        model = config.instantiate(cfg.model)
        base = config.instantiate(base_config(a))
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    if RECIPES[a.recipe][2]:
        validate_missing_and_unexpected_for_lora(
            lora_attn_modules=list(cfg.model.lora_attn_modules), apply_lora_to_mlp=cfg.model.apply_lora_to_mlp,
            apply_lora_to_output=False, base_missing=missing, base_unexpected=unexpected)
    elif missing or unexpected:
        fail(f"--model {a.model}: the base's weights do not load into the full model: {missing} {unexpected}")
    parameters = sum(p.numel() for p in base.parameters())
    print(json.dumps({"recipe": RECIPES[a.recipe][1], "model": cfg.model["_component_"], "parameters": parameters}))


class StepClock:
    """The recipe's metric logger: the time of each per-step log call and what the recipe logged."""

    def __init__(self):
        from torch._dynamo.utils import counters  # graphs compiled so far (torch.compile: recompiles show here)
        self.counters = counters
        self.times, self.logged, self.graphs = [], [], []

    def log_dict(self, payload, step):
        self.times.append(time.perf_counter())
        self.logged.append({k: float(v) for k, v in payload.items()})
        self.graphs.append(self.counters["stats"]["unique_graphs"])

    def log(self, name, data, step):
        pass

    def log_config(self, config):
        pass

    def close(self):
        pass


class BatchCount:
    """Wraps the data loader's collate function: each micro-batch's real tokens, positions computed, attended
    pairs (sum over its sequences of length x positions attended: padded rows attend their padded length as
    mgbench's formula counts; a pack's sequences only within themselves) and sequences (DPO: pairs), and its
    tokens as the recipe's metric counts them, in the order the loop takes them. On the host, before the batch goes to the device."""

    def __init__(self, collate, pad_id, bos_id):
        from torchtune.data import CROSS_ENTROPY_IGNORE_IDX
        self.collate, self.pad_id, self.bos_id, self.ignore = collate, pad_id, bos_id, CROSS_ENTROPY_IGNORE_IDX
        self.batches = []
        self.metric = []  # each micro-batch's tokens as the recipe's tokens_per_second_per_gpu counts them

    def __call__(self, samples):
        batch = self.collate(samples)
        # SFT: the labels not ignored; DPO: every position of the chosen and rejected rows.
        self.metric.append(batch[0].numel() if isinstance(batch, tuple) else int((batch["labels"] != self.ignore).sum()))
        if isinstance(batch, tuple):  # DPO: (input ids [2B, T], labels [2B, T]), chosen then rejected
            ids = batch[0]
            self.record(int((ids != self.pad_id).sum()), ids.numel(), ids.numel() * ids.shape[1], ids.shape[0] // 2)
        elif "input_pos" in batch:  # packed: each pack's sequences start at BOS; its padding is a last run without
            real = attended = sequences = 0
            for pack in samples:
                lengths = pack["seq_lens"].tolist()
                for start, n in zip(accumulate([0] + lengths[:-1]), lengths):
                    if int(pack["tokens"][start]) == self.bos_id:
                        real, attended, sequences = real + n, attended + n * n, sequences + 1
            self.record(real, batch["tokens"].numel(), attended, sequences)
        else:  # padded rows [B, T]
            tokens = batch["tokens"]
            self.record(int((tokens != self.pad_id).sum()), tokens.numel(), tokens.numel() * tokens.shape[1],
                        tokens.shape[0])
        return batch

    def record(self, real, positions, attended, sequences):
        self.batches.append((real, positions, attended, sequences))


def matmul_parameters(model):
    """The parameters a position multiplies through: every linear's weight (LoRA's adapters left out, as in mgbench's
    count) and the output projection, tied or not (TorchTune's TiedLinear holds no weight of its own)."""
    import torch
    from torchtune.modules.peft import LoRALinear
    total = 0
    for name, module in model.named_modules():
        if ".lora_" in name or name.startswith("lora_"):
            continue
        if isinstance(module, LoRALinear):
            total += module.in_dim * module.out_dim
        elif isinstance(module, torch.nn.Linear):
            total += module.in_features * module.out_features
    if not isinstance(model.output, torch.nn.Module):
        total += model.tok_embeddings.num_embeddings * model.tok_embeddings.embedding_dim
    return total


def step_flops(a, model, positions, attended):
    """mgbench's flops_of for one step of these positions and attended pairs."""
    layer = model.layers[0].attn
    per_parameter = 6.0 if a.recipe == "full" else 4.0
    attention = 6.0 * len(model.layers) * layer.num_heads * layer.head_dim
    flops = positions * per_parameter * matmul_parameters(model) + attended * attention
    return 1.5 * flops if a.recipe == "dpo" else flops


def run(a, out_dir):
    import torch
    cfg = recipe_config(a, out_dir)
    if a.dry_run:
        check_on_meta(a, cfg)
        return
    Peer = load_recipe(a)
    recipe = Peer(cfg=cfg)
    t_setup = time.perf_counter()
    recipe.setup(cfg=cfg)
    setup_s = time.perf_counter() - t_setup
    if a.device.startswith("cuda"):  # the peak of the training steps, not of the set-up's random base beside the model
        torch.cuda.reset_peak_memory_stats()
    clock = StepClock()
    recipe._metric_logger = clock
    loader = recipe._dataloader
    counter = BatchCount(loader.collate_fn, recipe._tokenizer.pad_id, recipe._tokenizer.bos_id)
    loader.collate_fn = counter
    recipe.train()
    recipe.cleanup()
    steps = len(clock.times)
    if steps != a.max_steps:
        fail(f"the recipe took {steps} optimizer steps of --max-steps {a.max_steps}: too few rows (--limit, --data)")
    k = a.warmup_steps_excluded
    span_s = clock.times[-1] - clock.times[k - 1]
    timed = counter.batches[k * a.grad_accum:steps * a.grad_accum]
    real = sum(b[0] for b in timed)
    positions = sum(b[1] for b in timed)
    flops = step_flops(a, recipe._model, positions, sum(b[2] for b in timed))
    logged_tps = [d["tokens_per_second_per_gpu"] for d in clock.logged[k:]]
    row = {"side": "torchtune", "run_name": a.run_name, "recipe": a.recipe, "model": a.model,
           "padding": a.padding, "precision": a.precision, "compile": a.compile == "true",
           "activation_checkpointing": a.activation_checkpointing == "true", "batch_size": a.batch_size,
           "grad_accum": a.grad_accum, "max_seq_len": a.max_seq_len, "steps": steps, "timed_steps": steps - k,
           "setup_s": setup_s, "s_per_it": span_s / (steps - k), "tokens_per_s": real / span_s,
           "padded_tokens_per_s": positions / span_s, "flops_per_s": flops / span_s,
           "samples_per_step": sum(b[3] for b in timed) / (steps - k),
           "logged_tokens_per_s": sum(logged_tps) / len(logged_tps),
           # The tokens its metric counted in each step after the first: its rate times its own step time,
           # which runs from just after one log call to just before the next (the clock's interval).
           "logged_step_tokens": [d["tokens_per_second_per_gpu"] * (t1 - t0)
                                  for d, t0, t1 in zip(clock.logged[1:], clock.times, clock.times[1:])],
           "step_tokens": [sum(b[0] for b in counter.batches[i * a.grad_accum:(i + 1) * a.grad_accum])
                           for i in range(steps)],
           "step_sequences": [sum(b[3] for b in counter.batches[i * a.grad_accum:(i + 1) * a.grad_accum])
                              for i in range(steps)],
           "step_metric_tokens": [sum(counter.metric[i * a.grad_accum:(i + 1) * a.grad_accum]) for i in range(steps)],
           "step_s": [t1 - t0 for t0, t1 in zip(clock.times, clock.times[1:])],
           "losses": [d["loss"] for d in clock.logged],
           # torch.compile's graphs compiled during the timed steps (a recompile there is in the timing: 0 expected)
           "graphs_compiled_in_timed_steps": clock.graphs[-1] - clock.graphs[k - 1],
           "peak_memory_bytes": torch.cuda.max_memory_allocated() if a.device.startswith("cuda") else None,
           "versions": {"torch": torch.__version__, "torchtune": version_of("torchtune")}}
    with open(a.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"torchtune {a.recipe} {a.padding} {a.precision} compile={a.compile}: {row['s_per_it']:.4f} s/it, "
          f"{row['tokens_per_s']:.0f} tokens/s (its metric logger: {row['logged_tokens_per_s']:.0f}), "
          f"first loss {row['losses'][0]:.6f}")
    if row["graphs_compiled_in_timed_steps"]:
        print(f"peer_torchtune.py: {row['graphs_compiled_in_timed_steps']} graph(s) compiled during the timed steps: "
              f"their compile time is in the timing; raise --warmup-steps-excluded", file=sys.stderr)


def version_of(name):
    from importlib.metadata import version
    return version(name)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="peer-torchtune-") as out_dir:
        # Offline, and Hugging Face datasets' cache (the JSON file as Arrow) in the run's folder unless one is given.
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(out_dir, "hf-datasets"))
        run(a, out_dir)


if __name__ == "__main__":
    main()
