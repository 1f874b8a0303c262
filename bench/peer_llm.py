#!/usr/bin/env python3
"""The Python peer of `mgbench llm`, written the usual way: transformers' LlamaForCausalLM (SDPA
attention, no key/value cache) + peft's LoRA + torch.optim.AdamW(fused=True) with TorchTune's cosine
schedule with warm-up, on exactly the rows mgbench trains on (token ids and labels dumped by
`mgbench data stats --dump`), in the same order (no shuffling), the same batch, precision, learning
rate, warm-up and step count.

  --recipe lora  supervised fine-tuning: next-token cross-entropy summed over the targets, divided by
                 their number (TorchTune 0.6's token normalisation).
  --recipe dpo   TorchTune 0.6.1's lora_dpo step (its own modules cannot share a process with this
                 peft: its torchao is older): concatenated_forward (chosen rows then rejected,
                 right-padded together; full logits .float()), get_batch_log_probs, the reference
                 under no_grad with peft's disable_adapter(), DPOLoss (-logsigmoid(beta z)), mean.

    peer_llm.py --recipe lora --model DIR --rows rows.jsonl --batch-size 2 --steps 20 --pad-id 2004 [--precision fp32]

Prints one JSON line: {"tokens_per_s": ..., "s_per_it": ..., "train_s": ..., "tokens": ...,
"ops_per_step": ...}: real (non-padding) input tokens (dpo: of chosen and rejected) and the training
loop's time, the first two steps left out (the first's lazy initialisation; the second's ATen ops
counted under torch.profiler, its aten:: events, as mgbench counts them with --warmup-steps-excluded
2); ops_per_step is null with --profile.
"""
import argparse
import json
import math
import sys
import time

import peft
import torch
import transformers

from llm_peer_common import padded

# Each recipe's defaults: TorchTune's llama3/8B_lora and llama3_1/8B_lora_dpo configs.
DEFAULTS = {"lora": {"lr": 3e-4, "weight_decay": 0.01}, "dpo": {"lr": 5e-4, "weight_decay": 0.05}}


def batch_log_probs(logits, labels):  # torchtune.rlhf.get_batch_log_probs
    labels = labels[:, 1:].clone()
    logits = logits[:, :-1, :]
    mask = labels != -100
    labels[labels == -100] = 0
    per_token = torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2)).squeeze(2)
    return (per_token * mask).sum(-1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--recipe", choices=sorted(DEFAULTS), default="lora")
    p.add_argument("--model", required=True)
    p.add_argument("--rows", required=True, help="`mgbench data stats --dump` output (samples, or pairs for dpo)")
    p.add_argument("--batch-size", type=int, default=2, help="samples (dpo: pairs) per step")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--lr", type=float, help="default: the recipe's")
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--beta", type=float, default=0.1, help="dpo")
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-alpha", type=float, default=16)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--pad-id", type=int, required=True)
    p.add_argument("--profile", action="store_true",
                   help="run the steps under torch.profiler and print the attention kernels' share of the CPU "
                        "time (slows the steps: its tokens/s is not a measurement)")
    a = p.parse_args()
    defaults = DEFAULTS[a.recipe]
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(42)
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    model = transformers.LlamaForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation="sdpa")
    model.config.use_cache = False  # training: no key/value cache built in forward (TorchTune's models have none)
    config = peft.LoraConfig(r=a.lora_rank, lora_alpha=a.lora_alpha, lora_dropout=0.0, bias="none",
                             target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = peft.get_peft_model(model, config)
    model.train()
    params = [q for q in model.parameters() if q.requires_grad]
    # fused=True: TorchTune's LoRA / DPO configs ask it, and mgbench's AdamW is the fused kernel too.
    opt = torch.optim.AdamW(params, lr=a.lr or defaults["lr"], weight_decay=defaults["weight_decay"], fused=True)

    def lr_lambda(step):  # torchtune's get_cosine_schedule_with_warmup
        if step < a.warmup_steps:
            return step / max(1, a.warmup_steps)
        progress = (step - a.warmup_steps) / max(1, a.steps - a.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    data = [json.loads(line) for line in open(a.rows)]
    tokens_done, start = 0, None
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if a.profile else None
    if profiler:
        profiler.__enter__()
    ops_per_step = None
    for step in range(a.steps):
        if step == 2:
            start = time.perf_counter()  # the first two steps are left out: warm-up, and the one counted
        counter = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) \
            if step == 1 and not profiler else None
        if counter:
            counter.__enter__()
        batch = data[step * a.batch_size:(step + 1) * a.batch_size]
        if a.recipe == "dpo":
            rows = [(s["chosen_tokens"], s["chosen_labels"]) for s in batch] + \
                   [(s["rejected_tokens"], s["rejected_labels"]) for s in batch]
            ids, labels = padded(rows, a.pad_id)
            n = len(batch)
            policy = batch_log_probs(model(input_ids=ids).logits.float(), labels)
            with torch.no_grad(), model.disable_adapter():
                reference = batch_log_probs(model(input_ids=ids).logits.float(), labels)
            z = (policy[:n] - policy[n:]) - (reference[:n] - reference[n:])
            loss = -torch.nn.functional.logsigmoid(a.beta * z).mean()
        else:
            rows = [(s["tokens"], s["labels"]) for s in batch]
            ids, labels = padded(rows, a.pad_id)
            logits = model(input_ids=ids).logits
            summed = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)),
                                                       labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum")
            loss = summed / (labels[:, 1:] != -100).sum()
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if counter:
            counter.__exit__(None, None, None)
            ops_per_step = sum(1 for e in counter.events() if e.name.startswith("aten::"))
        if step >= 2:
            tokens_done += sum(len(t) for t, _ in rows)
    train_s = time.perf_counter() - start
    if profiler:
        profiler.__exit__(None, None, None)
        events = profiler.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        attention = sum(e.self_cpu_time_total for e in events if "scaled_dot_product" in e.key)
        print(json.dumps({"attention_share": attention / total,
                          "top": [(e.key, round(e.self_cpu_time_total / total, 4)) for e in
                                  sorted(events, key=lambda e: -e.self_cpu_time_total)[:8]]}), file=sys.stderr)
    print(json.dumps({"tokens_per_s": tokens_done / train_s, "s_per_it": train_s / (a.steps - 2),
                      "train_s": train_s, "tokens": tokens_done, "ops_per_step": ops_per_step}), flush=True)


if __name__ == "__main__":
    main()
