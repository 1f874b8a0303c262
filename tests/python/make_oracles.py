#!/usr/bin/env python3
"""Writes reference outputs of PyTorch / torchvision that mgbench's unit tests compare against.

    make_oracles.py OUT_DIR

Produces, in OUT_DIR:
  sampler_cases.json     torch.utils.data.DistributedSampler index sequences for many settings
  buckets_cases.json     DDP's bucket assignment (torch.distributed's _compute_bucket_assignment_by_size)
  mobilenet_w{W}.pt      torchvision mobilenet_v2(num_classes=10, width_mult=W) state_dict (float64)
  mobilenet_w{W}_io.pt   inputs, eval-mode logits, train-mode loss and gradients for the same model
  mobilenet_names.json   parameter/buffer names, shapes and parameter counts per width
  resnet50.pt            torchvision resnet50(num_classes=10) state_dict drawn with seed 0 (float32)
  resnet50_io.pt         RGB and grayscale inputs, eval-mode logits, train-mode loss, gradients and
                         running statistics of that model in float64
  resnet50_names.json    names, shapes and parameter counts of resnet50 with 10 and 1000 classes
  grad_scaler.json       torch.amp.GradScaler trajectory (scale, growth tracker, parameters) on CPU
  llama_tiny*/           tiny random transformers LlamaForCausalLM checkpoints (untied, tied, sharded)
  llama_tiny_io.pt       their input ids and fp32 logits (eager attention)
  llama_tiny_nf4/        llama_tiny_2256's vocabulary with projections NF4 can hold, in 4 and 8 blocks
                         of 16,384 weights (QLoRA runs; FSDP shards them over 1, 2 or 4 ranks)
  llama_tiny_2256_lora/  a peft LoRA adapter (non-zero B) of llama_tiny_2256
  dpo_log_probs.pt       sequences with masked prompts and their summed target log-probs under
                         llama_tiny_2256 with that adapter (policy) and with peft's disable_adapter()
                         (reference), as TorchTune's get_batch_log_probs sums them
  dpo_loss_cases.json    TorchTune 0.6.1's DPOLoss on random log-probs (from the folder TorchTune is
                         installed in beside the venv, in a process of its own)
  images/                JPEG / PNG files and PIL's pixels, torchvision's crop draws and resizes
                         (image_oracles.py)
  quant_oracles.pt       torchao 0.11's NF4 and 8da4w QAT, TorchTune's QLoRA and QAT-LoRA linears
                         (quant_oracles.py, in a process of its own as the DPO loss)

Exits 0 without writing anything when torch/torchvision are not importable, so the tests that
need these files report SKIPPED rather than fail.
"""
import json
import os
import sys

try:
    import torch
    import torch.distributed as dist
    import torchvision
    from torch.utils.data import DistributedSampler
except ImportError as e:  # pragma: no cover - environment without the oracle
    print(f"make_oracles: {e}; oracle files not written (tests will be skipped)")
    sys.exit(0)

out = sys.argv[1]
os.makedirs(out, exist_ok=True)

# --- DistributedSampler ---------------------------------------------------------------------
cases = []
for n in (1, 2, 7, 10, 100, 1001, 60000):
    for world in (1, 2, 3, 4, 8):
        for shuffle in (True, False):
            for drop_last in (False, True):
                for seed, epoch in ((0, 0), (42, 3)):
                    if n == 60000 and (world not in (2, 3) or not shuffle):
                        continue
                    for rank in range(world):
                        s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle,
                                               seed=seed, drop_last=drop_last)
                        s.set_epoch(epoch)
                        cases.append(dict(n=n, world=world, rank=rank, seed=seed, epoch=epoch,
                                          shuffle=shuffle, drop_last=drop_last, indices=list(s)))
with open(os.path.join(out, "sampler_cases.json"), "w") as f:
    json.dump(cases, f)

# --- DDP bucket assignment --------------------------------------------------------------------
MiB = 1024 * 1024


def ddp_buckets(tensors, first, cap):
    """Steady-state DDP buckets: gradient-ready order (reverse registration), limits [first, cap]."""
    order = list(reversed(range(len(tensors))))
    buckets, _ = dist._compute_bucket_assignment_by_size(
        [tensors[i] for i in order], [first, cap], [False] * len(tensors), order)
    return buckets


bucket_cases = []
for dtype in (torch.float32, torch.float64):
    model = torchvision.models.mobilenet_v2(num_classes=10).to(dtype)
    params = [p.detach() for p in model.parameters()]
    for first, cap in ((1 * MiB, 25 * MiB), (64 * 1024, 1 * MiB), (1, 1)):
        bucket_cases.append(dict(name=f"mobilenet_v2 {dtype} {first}/{cap}", first=first, cap=cap,
                                 bytes=[p.numel() * p.element_size() for p in params],
                                 dtypes=[0] * len(params), buckets=ddp_buckets(params, first, cap),
                                 ordered=True))
g = torch.Generator().manual_seed(0)
mixed = [torch.empty(int(torch.randint(1, 5000, (1,), generator=g)),
                     dtype=torch.float32 if k % 3 else torch.float64) for k in range(40)]
bucket_cases.append(dict(name="mixed dtypes", first=4096, cap=32768,
                         bytes=[t.numel() * t.element_size() for t in mixed],
                         dtypes=[0 if t.dtype == torch.float32 else 1 for t in mixed],
                         buckets=ddp_buckets(mixed, 4096, 32768), ordered=False))
with open(os.path.join(out, "buckets_cases.json"), "w") as f:
    json.dump(bucket_cases, f)

# --- MobileNetV2 ------------------------------------------------------------------------------
names = {}
for width in (1.0, 0.5, 0.25):
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v2(num_classes=10, width_mult=width).double()
    tag = f"w{width:g}"
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save(state, os.path.join(out, f"mobilenet_{tag}.pt"))
    names[tag] = dict(
        width=width,
        parameters=sum(p.numel() for p in model.parameters()),
        tensors={k: list(v.shape) for k, v in model.state_dict().items()},
        parameter_names=[k for k, _ in model.named_parameters()],
    )
    gray = torch.rand(4, 1, 64, 64, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    labels = torch.tensor([3, 1, 4, 1])
    model.eval()
    with torch.no_grad():
        eval_logits = model(gray.expand(-1, 3, -1, -1))
    # Train mode (batch statistics), dropout off so the result is deterministic.
    model.train()
    model.classifier[0].p = 0.0
    loss = torch.nn.functional.cross_entropy(model(gray.expand(-1, 3, -1, -1)), labels)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    torch.save({"input": gray, "labels": labels, "eval_logits": eval_logits, "train_loss": loss.detach(),
                "grad.features.0.0.weight": grads["features.0.0.weight"],
                "grad.features.1.conv.0.0.weight": grads["features.1.conv.0.0.weight"],
                "grad.classifier.1.weight": grads["classifier.1.weight"]},
               os.path.join(out, f"mobilenet_{tag}_io.pt"))
with open(os.path.join(out, "mobilenet_names.json"), "w") as f:
    json.dump(names, f)

# --- ResNet-50 --------------------------------------------------------------------------------
# torchvision resnet50(num_classes=10) drawn in fp32 after manual_seed(0) -- the C++ model's own
# initialisation is compared with it -- and stored in fp32 (94 MB; fp64 would be twice that): fp64
# holds those values exactly, and the model computes in fp64. Inputs: 2 RGB images and 2 grayscale
# images (torchvision sees them replicated to 3 channels) at 64 px; each case starts from the saved
# state (its train-mode forward moves the running statistics).
torch.manual_seed(0)
model = torchvision.models.resnet50(num_classes=10)
initial = {k: v.clone() for k, v in model.state_dict().items()}
torch.save(initial, os.path.join(out, "resnet50.pt"))
with torch.device("meta"):
    imagenet = torchvision.models.resnet50()  # shapes only: 1000 classes, nothing drawn
resnet_names = {}
for m in (model, imagenet):
    resnet_names[f"classes{m.fc.out_features}"] = dict(
        num_classes=m.fc.out_features, parameters=sum(p.numel() for p in m.parameters()),
        tensors={k: list(v.shape) for k, v in m.state_dict().items()},
        parameter_names=[k for k, _ in m.named_parameters()])
with open(os.path.join(out, "resnet50_names.json"), "w") as f:
    json.dump(resnet_names, f)
model = model.double()
gen = torch.Generator().manual_seed(2)
resnet_io = {"labels": torch.tensor([3, 7])}
for case, channels in (("rgb", 3), ("gray", 1)):
    x = torch.rand(2, channels, 64, 64, generator=gen, dtype=torch.float64)
    model.load_state_dict(initial)
    model.eval()
    with torch.no_grad():
        resnet_io[f"{case}.eval_logits"] = model(x.expand(-1, 3, -1, -1))
    model.train()
    model.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x.expand(-1, 3, -1, -1)), resnet_io["labels"])
    loss.backward()
    resnet_io[f"{case}.input"] = x
    resnet_io[f"{case}.train_loss"] = loss.detach()
    # Every parameter's gradient norm (registration order), some gradients whole, the statistics.
    resnet_io[f"{case}.grad_norms"] = torch.stack([p.grad.norm() for p in model.parameters()])
    for name in ("conv1.weight", "bn1.bias", "layer1.0.downsample.0.weight", "layer2.0.conv2.weight", "fc.weight",
                 "fc.bias"):
        resnet_io[f"{case}.grad.{name}"] = model.get_parameter(name).grad.clone()
    for name in ("bn1.running_mean", "layer1.0.downsample.1.running_var", "layer4.2.bn3.running_mean",
                 "layer4.2.bn3.num_batches_tracked"):
        resnet_io[f"{case}.after_train.{name}"] = model.get_buffer(name).clone()
torch.save(resnet_io, os.path.join(out, "resnet50_io.pt"))

# --- torch.amp.GradScaler -------------------------------------------------------------------
# Two float32 parameters, SGD with momentum; loss = sum(p1 * g1) + sum(p2 * g2), so the
# gradients are exactly g (times the scale before unscaling). Some steps overflow. Gradients
# are written as strings ("inf", "nan": JSON has no non-finite numbers).
inf, nan = float("inf"), float("nan")
grad_steps = [([1.0, -2.0, 0.5], [0.25, 1.0]), ([inf, 1.0, 1.0], [1.0, 1.0]), ([2.0, 2.0, 2.0], [1.0, -1.0]),
              ([3.0, 0.0, -3.0], [0.5, 0.5]), ([1.0, 1.0, 1.0], [nan, 1.0]), ([1e38, 1.0, 1.0], [1.0, 1.0]),
              ([-1.0, 4.0, 2.0], [2.0, 2.0]), ([0.5, 0.5, 0.5], [0.5, 0.5]), ([1.0, 2.0, 3.0], [4.0, 5.0])]
p1 = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
p2 = torch.nn.Parameter(torch.tensor([-1.0, 0.5]))
opt = torch.optim.SGD([p1, p2], lr=0.1, momentum=0.9)
scaler = torch.amp.GradScaler("cpu", init_scale=16.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2)
trajectory = []
for g1, g2 in grad_steps:
    opt.zero_grad()
    loss = (p1 * torch.tensor(g1)).sum() + (p2 * torch.tensor(g2)).sum()
    scaler.scale(loss).backward()
    stepped_before = p1.detach().clone()
    scaler.step(opt)
    scaler.update()
    trajectory.append({"scale": scaler.get_scale(), "growth_tracker": int(scaler._growth_tracker.item()),
                       "stepped": not torch.equal(stepped_before, p1.detach()),
                       "p1": p1.detach().tolist(), "p2": p2.detach().tolist()})
with open(os.path.join(out, "grad_scaler.json"), "w") as f:
    json.dump({"init_scale": 16.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2,
               "lr": 0.1, "momentum": 0.9, "p1": [1.0, 2.0, 3.0], "p2": [-1.0, 0.5],
               "steps": [{"g1": [str(v) for v in g1], "g2": [str(v) for v in g2]} for g1, g2 in grad_steps], "trajectory": trajectory}, f)

# --- transformers LlamaForCausalLM -----------------------------------------------------------
try:
    import transformers
except ImportError:  # pragma: no cover
    transformers = None
if transformers is not None:
    io = {}
    for tag, tied, shard in (("llama_tiny", False, None), ("llama_tiny_tied", True, None),
                             ("llama_tiny_sharded", False, "40KB")):
        torch.manual_seed(7)
        cfg = transformers.LlamaConfig(
            vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
            rope_theta=500000.0, tie_word_embeddings=tied,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64})
        model = transformers.LlamaForCausalLM(cfg).to(torch.float32).eval()
        model.config._attn_implementation = "eager"  # an attention path independent of SDPA
        kwargs = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(os.path.join(out, tag), safe_serialization=True, **kwargs)
        ids = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            io[f"{tag}.logits"] = model(ids).logits
        io[f"{tag}.ids"] = ids
    torch.save(io, os.path.join(out, "llama_tiny_io.pt"))

    # A tiny model whose vocabulary fits TorchTune's tiktoken_small.model (2,000 ranks + 256
    # Llama 3 special tokens), for `mgbench llm` runs and --eval-only against transformers.
    def tiny_2256(name, seed, **sizes):
        torch.manual_seed(seed)
        cfg = transformers.LlamaConfig(vocab_size=2256, num_hidden_layers=2, num_attention_heads=4,
                                       max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=500000.0,
                                       tie_word_embeddings=False, **sizes)
        transformers.LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(os.path.join(out, name))

    tiny_2256("llama_tiny_2256", 9, hidden_size=64, intermediate_size=128, num_key_value_heads=2, head_dim=16)
    # The same vocabulary with projections NF4 can hold (numel a multiple of 16384), for QLoRA runs.
    tiny_2256("llama_tiny_nf4", 10, hidden_size=256, intermediate_size=512, num_key_value_heads=4, head_dim=64)

    # peft LoRA on llama_tiny: adapter file (PEFT names) and the gradients of one batch.
    try:
        import peft
    except ImportError:  # pragma: no cover
        peft = None
    if peft is not None:
        base = transformers.LlamaForCausalLM.from_pretrained(os.path.join(out, "llama_tiny"), dtype=torch.float32)
        base.config._attn_implementation = "eager"
        lora_cfg = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none",
                                   target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
        model = peft.get_peft_model(base, lora_cfg)
        torch.manual_seed(11)
        with torch.no_grad():  # non-zero B, so that A gets gradients too
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.05)
        model.save_pretrained(os.path.join(out, "llama_tiny_lora"))
        ids = io["llama_tiny.ids"]
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
        loss.backward()
        grads = {"loss": loss.detach(), "logits": logits.detach()}
        for name, p in model.named_parameters():
            if p.requires_grad:
                grads["grad." + name.replace(".default", "")] = p.grad.detach().clone()
        torch.save(grads, os.path.join(out, "llama_tiny_lora_grads.pt"))

        # DPO: llama_tiny_2256 with a LoRA adapter as the policy, the same model with
        # disable_adapter() as the reference; sequences of 4 rows with masked prompts, right-padded.
        small = transformers.LlamaForCausalLM.from_pretrained(os.path.join(out, "llama_tiny_2256"),
                                                              dtype=torch.float32)
        small.config._attn_implementation = "eager"
        policy = peft.get_peft_model(small, peft.LoraConfig(
            r=4, lora_alpha=8, lora_dropout=0.0, bias="none",
            target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        torch.manual_seed(13)
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.05)
        policy.save_pretrained(os.path.join(out, "llama_tiny_2256_lora"))
        policy.eval()
        gen = torch.Generator().manual_seed(5)
        lengths, prompts = [17, 9, 23, 12], [5, 3, 20, 4]
        ids = torch.full((4, max(lengths)), 2004, dtype=torch.long)  # <|finetune_right_pad_id|> of tiktoken_small
        labels = torch.full((4, max(lengths)), -100, dtype=torch.long)
        for r, (n, k) in enumerate(zip(lengths, prompts)):
            ids[r, :n] = torch.randint(0, 2000, (n,), generator=gen)
            labels[r, k:n] = ids[r, k:n]

        def batch_log_probs(logits, labels):  # TorchTune 0.6.1 rlhf.get_batch_log_probs
            labels = labels[:, 1:].clone()
            logits = logits[:, :-1, :].float()
            mask = labels != -100
            labels[labels == -100] = 0
            per_token = torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2)).squeeze(2)
            return (per_token * mask).sum(-1)

        with torch.no_grad():
            policy_logps = batch_log_probs(policy(input_ids=ids).logits, labels)
            with policy.disable_adapter():
                reference_logps = batch_log_probs(policy(input_ids=ids).logits, labels)
        torch.save({"ids": ids, "labels": labels, "lengths": torch.tensor(lengths), "policy": policy_logps,
                    "reference": reference_logps}, os.path.join(out, "dpo_log_probs.pt"))

# --- DPOLoss: TorchTune's own, in a process of its own (its torchao clashes with peft) ------------
_torchtune_site = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "torchtune-site")
_dpo_script = r"""
import json, sys, types
for name in ("datasets", "datasets.distributed"):  # imported by torchtune.data, never used here
    m = types.ModuleType(name); m.load_dataset, m.Dataset, m.split_dataset_by_node = None, object, None
    sys.modules[name] = m
sys.modules["datasets"].distributed = sys.modules["datasets.distributed"]
import torch
from torchtune.rlhf.loss import DPOLoss
cases = []
gen = torch.Generator().manual_seed(17)
for beta in (0.1, 0.5):
    for smoothing in (0.0, 0.2):
        inputs = [(-50.0 * torch.rand(6, generator=gen, dtype=torch.float64)) for _ in range(4)]
        losses, chosen, rejected = DPOLoss(beta=beta, label_smoothing=smoothing)(*inputs)
        cases.append(dict(beta=beta, label_smoothing=smoothing, inputs=[x.tolist() for x in inputs],
                          losses=losses.tolist(), chosen_rewards=chosen.tolist(), rejected_rewards=rejected.tolist()))
json.dump(cases, open(sys.argv[1], "w"))
"""
if os.path.isdir(os.path.join(_torchtune_site, "torchtune")):
    import subprocess
    _env = dict(os.environ, PYTHONPATH=_torchtune_site)
    _done = subprocess.run([sys.executable, "-c", _dpo_script, os.path.join(out, "dpo_loss_cases.json")], env=_env,
                           capture_output=True, text=True)
    if _done.returncode != 0:  # pragma: no cover - reported, the DPO loss test then skips
        print(f"make_oracles: TorchTune's DPOLoss failed: {_done.stderr[-2000:]}")
    # NF4, QLoRA and 8da4w QAT references (torchao 0.11, TorchTune 0.6.1): quant_oracles.py.
    _stories = os.path.join(os.environ.get("MGBENCH_SHARED_DATA", os.path.join(os.path.dirname(__file__), "..", "..",
                                                                               "..", "shared", "data")),
                            "models", "stories260K", "stories260K.bin")
    _done = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "quant_oracles.py"),
                            os.path.join(out, "quant_oracles.pt"), _stories], env=_env, capture_output=True, text=True)
    if _done.returncode != 0:  # pragma: no cover - reported, the quantisation tests then skip
        print(f"make_oracles: quant_oracles.py failed: {_done.stderr[-2000:]}")

# JPEG / PNG decoding (PIL) and the image transforms (torchvision): image_oracles.py, OUT/images/.
import subprocess  # noqa: E402

_done = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "image_oracles.py"), out],
                       capture_output=True, text=True)
if _done.returncode != 0:  # pragma: no cover - reported, the image tests then skip
    print(f"make_oracles: image_oracles.py failed: {_done.stderr[-2000:]}")

print(f"make_oracles: wrote {len(cases)} sampler cases, {len(bucket_cases)} bucket cases, "
      f"{len(names)} MobileNetV2 widths to {out}")
