#!/usr/bin/env python3
"""The Python peer of `mgbench llm --recipe full --sharding fsdp` and its test oracle
(tests/python/test_fsdp.py): torch's own FSDP2 (`fully_shard`, torch 2.11) on the CPU with gloo, sharded as TorchTune's
full_finetune_distributed shards Llama 3 (each decoder layer, then the token embedding and the output
head -- custom_sharded_layers -- then the root), trained as mgbench's `full` recipe trains: each rank's
rows as mgbench computed them (--record-indices), summed cross-entropy over the targets, scaled by
world size / the step's targets on all ranks (TorchTune 0.6's token normalisation; FSDP averages),
AdamW at a constant learning rate. Run by torchrun with 2+ processes:

    torchrun --standalone --nproc-per-node 2 bench/peer_fsdp.py --model DIR --rows rows.jsonl \
        --indices indices.json --batch-size 2 --steps 3 --lr 1e-3 --weight-decay 0.01 --pad-id 2004 --out DIR

Writes to --out: rank-<rank>.json (each step's loss per target, real tokens and seconds on that rank,
the rank's peak resident memory, each parameter's local shard rows), and from rank 0
model.safetensors (the trained parameters, gathered).
"""
import argparse
import json
import os
import resource
import time

import torch
import torch.distributed as dist
import transformers
from safetensors.torch import save_file
from torch.distributed.fsdp import fully_shard

from llm_peer_common import padded


def main():
    p = argparse.ArgumentParser()
    for name in ("--model", "--rows", "--indices", "--out"):
        p.add_argument(name, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--weight-decay", type=float, required=True)
    p.add_argument("--pad-id", type=int, required=True)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    model = transformers.LlamaForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model.model.embed_tokens)
    if not model.config.tie_word_embeddings:
        fully_shard(model.lm_head)
    fully_shard(model)
    shard_rows = {name: param.to_local().shape[0] for name, param in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    rows = [json.loads(line) for line in open(a.rows)]
    mine = json.load(open(a.indices))[str(rank)]
    losses, tokens, seconds = [], [], []
    for step in range(a.steps):
        start = time.perf_counter()
        batch = [rows[i] for i in mine[step * a.batch_size:(step + 1) * a.batch_size]]
        ids, labels = padded([(r["tokens"], r["labels"]) for r in batch], a.pad_id)
        logits = model(ids).logits[:, :-1].float()
        targets = labels[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                                                 ignore_index=-100, reduction="sum")
        count = torch.tensor([float((targets != -100).sum())])
        total = count.clone()
        dist.all_reduce(total)
        (loss * world / total).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item() / count.item())
        seconds.append(time.perf_counter() - start)
        tokens.append(sum(len(r["tokens"]) for r in batch))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    json.dump({"losses": losses, "tokens": tokens, "step_s": seconds, "peak_memory_bytes": peak,
               "shard_rows": shard_rows}, open(os.path.join(a.out, f"rank-{rank}.json"), "w"))
    full = {name: value.full_tensor() for name, value in model.state_dict().items()}
    if rank == 0:
        save_file({k: v.contiguous() for k, v in full.items()}, os.path.join(a.out, "model.safetensors"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
