#!/usr/bin/env python3
"""The Python peer of `mgbench llm --recipe dpo`: TorchTune 0.6.1's lora_dpo recipe step written with
transformers' LlamaForCausalLM (SDPA attention) + peft's LoRA + torch.optim.AdamW (TorchTune's own
modules cannot share a process with this peft: its torchao is older), on exactly the pairs mgbench
trains on (chosen / rejected token ids and labels dumped by `mgbench data stats --dump`), in the
same order (no shuffling), the same batch, precision, learning rate and step count:
  concatenated_forward (chosen rows then rejected, right-padded together; full logits .float()),
  get_batch_log_probs, the reference under no_grad with peft's disable_adapter(), DPOLoss
  (-logsigmoid(beta z)), loss.mean() / grad_accum, AdamW, cosine schedule with warm-up.

    peer_dpo.py --model DIR --pairs pairs.jsonl --batch-size 2 --steps 20 --pad-id 2004 [--precision fp32]

Prints one JSON line: {"tokens_per_s": ..., "s_per_it": ..., "train_s": ..., "tokens": ...}: real
(non-padding) tokens of chosen and rejected and the training loop's time, as mgbench's summary.
"""
import argparse
import json
import math
import time

import peft
import torch
import transformers


def batch_log_probs(logits, labels):  # torchtune.rlhf.get_batch_log_probs
    labels = labels[:, 1:].clone()
    logits = logits[:, :-1, :]
    mask = labels != -100
    labels[labels == -100] = 0
    per_token = torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2)).squeeze(2)
    return (per_token * mask).sum(-1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--pairs", required=True)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-alpha", type=float, default=16)
    p.add_argument("--pad-id", type=int, required=True)
    a = p.parse_args()
    torch.manual_seed(42)
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    model = transformers.LlamaForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation="sdpa")
    config = peft.LoraConfig(r=a.lora_rank, lora_alpha=a.lora_alpha, lora_dropout=0.0, bias="none",
                             target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = peft.get_peft_model(model, config)
    model.train()
    params = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.05)

    def lr_lambda(step):  # torchtune's get_cosine_schedule_with_warmup
        if step < a.warmup_steps:
            return step / max(1, a.warmup_steps)
        progress = (step - a.warmup_steps) / max(1, a.steps - a.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    pairs = [json.loads(line) for line in open(a.pairs)]
    tokens_done, start = 0, None
    for step in range(a.steps):
        if step == 1:
            start = time.perf_counter()  # the first step (lazy initialisation) is left out, as warm-up
        batch = pairs[step * a.batch_size:(step + 1) * a.batch_size]
        rows = [(s["chosen_tokens"], s["chosen_labels"]) for s in batch] + \
               [(s["rejected_tokens"], s["rejected_labels"]) for s in batch]
        length = max(len(t) for t, _ in rows)
        ids = torch.full((len(rows), length), a.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), length), -100, dtype=torch.long)
        for i, (t, l) in enumerate(rows):
            ids[i, :len(t)] = torch.tensor(t)
            labels[i, :len(l)] = torch.tensor(l)
        n = len(batch)
        policy = batch_log_probs(model(input_ids=ids).logits.float(), labels)
        with torch.no_grad(), model.disable_adapter():
            reference = batch_log_probs(model(input_ids=ids).logits.float(), labels)
        z = (policy[:n] - policy[n:]) - (reference[:n] - reference[n:])
        loss = -torch.nn.functional.logsigmoid(a.beta * z).mean()
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step >= 1:
            tokens_done += sum(len(t) for t, _ in rows)
    train_s = time.perf_counter() - start
    print(json.dumps({"tokens_per_s": tokens_done / train_s, "s_per_it": train_s / (a.steps - 1),
                      "train_s": train_s, "tokens": tokens_done}), flush=True)


if __name__ == "__main__":
    main()
