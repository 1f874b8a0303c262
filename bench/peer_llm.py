#!/usr/bin/env python3
"""The Python peer of `mgbench llm`: the same LoRA fine-tuning written the usual way, with
transformers' LlamaForCausalLM (SDPA attention) + peft's LoRA + torch.optim.AdamW, on exactly the
samples mgbench trains on (token ids and labels dumped by `mgbench data stats --dump`), in the same
order (no shuffling), the same batch, precision, learning rate, warm-up and step count.

    peer_llm.py --model DIR --samples samples.jsonl --batch-size 2 --steps 20 [--precision fp32]

Prints one JSON line: {"tokens_per_s": ..., "s_per_it": ..., "train_s": ..., "tokens": ...}, where
tokens are the real (non-padding) input tokens and the time is the training loop's (as mgbench's
summary).
"""
import argparse
import json
import math
import time

import peft
import torch
import transformers


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--samples", required=True)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-alpha", type=float, default=16)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--pad-id", type=int, required=True)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(42)
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    model = transformers.LlamaForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation="sdpa")
    config = peft.LoraConfig(r=a.lora_rank, lora_alpha=a.lora_alpha, lora_dropout=0.0, bias="none",
                             target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = peft.get_peft_model(model, config)
    model.train()
    params = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.01)
    total = a.steps

    def lr_lambda(step):  # torchtune's get_cosine_schedule_with_warmup
        if step < a.warmup_steps:
            return step / max(1, a.warmup_steps)
        progress = (step - a.warmup_steps) / max(1, total - a.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    samples = [json.loads(line) for line in open(a.samples)]
    tokens_done, start = 0, None
    for step in range(a.steps):
        if step == 1:
            start = time.perf_counter()  # the first step (lazy initialisation) is left out, as warm-up
        batch = samples[step * a.batch_size:(step + 1) * a.batch_size]
        length = max(len(s["tokens"]) for s in batch)
        ids = torch.full((len(batch), length), a.pad_id, dtype=torch.long)
        labels = torch.full((len(batch), length), -100, dtype=torch.long)
        for i, s in enumerate(batch):
            ids[i, :len(s["tokens"])] = torch.tensor(s["tokens"])
            labels[i, :len(s["labels"])] = torch.tensor(s["labels"])
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum")
        n = (labels[:, 1:] != -100).sum()
        (loss / n).backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step >= 1:
            tokens_done += sum(len(s["tokens"]) for s in batch)
    train_s = time.perf_counter() - start
    print(json.dumps({"tokens_per_s": tokens_done / train_s, "s_per_it": train_s / (a.steps - 1),
                      "train_s": train_s, "tokens": tokens_done}), flush=True)


if __name__ == "__main__":
    main()
