"""Model check of `mgbench predict` against the paper (Lawenda et al. 2025, arXiv 2503.15252, Tables 2
and 5): from its 1-GPU rows and an assumed H100 link, predict its 2-4 GPU rows and say how close the
model lands. A model check, not a measurement: the paper gives only iteration and total times, so
each 1-GPU run is written as a results file whose training time is all compute (no phase split, no
evaluation).
- Table 2: the workload of inputs/configs/paper-table2.ini (DDP-DS, 20 epochs, 60,000 images, batch
  64 per rank, MobileNetV2 for 10 classes on 1 channel: its parameters counted from torchvision's
  model); the all-reduce of its gradients.
- Table 5: Llama-3-8B LoRA (TorchTune's llama3/8B_lora adapters) on alpaca-cleaned's 51,760 rows,
  FP32, batch 2 per GPU, an iteration one batch per GPU (the paper's totals / s/it say so), sharded
  with FSDP as TorchTune's distributed recipe shards it: the units' all-gathers and the adapters'
  reduce-scatters, none assumed hidden.

    ~/.cache/mgbench/venv/bin/python bench/paper_model_check.py [--link h100-nvlink|h100-pcie]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import mgbench_analysis as mga  # noqa: E402
from mgbench_analysis import paper  # noqa: E402

MGBENCH = os.environ.get("MGBENCH_BIN", os.path.join(ROOT, "build", "app", "mgbench"))


def mobilenet_v2_parameters():
    """MobileNetV2 (width 1, 10 classes) with a 1-channel stem, as mgbench builds it for MNIST."""
    import torchvision

    model = torchvision.models.mobilenet_v2(num_classes=10)
    stem = model.features[0][0]
    return sum(p.numel() for p in model.parameters()) - stem.weight.numel() // stem.in_channels * (stem.in_channels - 1)


def write_one_gpu_run(path, run_id, attributes, total_s, steps, epochs):
    """A completed 1-rank run whose training time is all compute: `epochs` epochs of `steps` steps."""
    string = h5py.string_dtype()
    with h5py.File(path, "a") as f:
        f.attrs["schema"] = "mgbench-results"
        f.attrs["schema_version"] = np.int64(5)
        run = f.create_group(f"runs/{run_id}")
        for name, value in {"run_id": run_id, "world_size": 1, "schema_version": 5, "epochs": epochs, "max_steps": 0,
                            "pin_memory": "false", "drop_last": "false", "strategy": "ddp-ds", **attributes}.items():
            if isinstance(value, str):
                run.attrs.create(name, value, dtype=string)
            elif isinstance(value, float):
                run.attrs[name] = value
            else:
                run.attrs[name] = np.int64(value)
        # UTF-8 fixed strings, as mgbench writes them (HDF5 does not convert between character sets).
        run.create_dataset("status", data=np.array([b"completed"], dtype=h5py.string_dtype("utf-8", 16)))
        summary = np.zeros(1, [("total_s", "<f8"), ("train_s", "<f8"), ("eval_s", "<f8")])
        summary[0] = (total_s, total_s, 0.0)
        run.create_dataset("summary", data=summary)
        rows = np.zeros(epochs, [("epoch", "<i4"), ("steps", "<i8"), ("train_s", "<f8"), ("forward_s", "<f8"),
                                 ("eval_s", "<f8")])
        for e in range(epochs):
            rows[e] = (e, steps, total_s / epochs, total_s / epochs, np.nan)
        run.create_dataset("rank_0/epochs", data=rows)


def predict(measured, predicted, link, strategy):
    subprocess.run([MGBENCH, "predict", measured, "--link", link, "--ranks", "1,2,3,4", "--strategies", strategy,
                    "--results", predicted], check=True, stdout=subprocess.DEVNULL)
    return mga.runs(predicted)


def table2(link, d):
    """Table 2: MobileNetV2 on 500 px MNIST, DDP-DS, FP64 / FP32 / FP16: the all-reduce of its gradients."""
    parameters = mobilenet_v2_parameters()
    measured, predicted = os.path.join(d, "table2.h5"), os.path.join(d, "table2-predicted.h5")
    epochs, samples, batch = 20, 60000, 64
    for row in paper.TABLE2[paper.TABLE2["ranks"] == 1].itertuples():
        write_one_gpu_run(measured, f"paper-table2-1gpu-{row.precision}",
                          {"task": "image", "precision": row.precision, "train_samples": samples, "batch_size": batch,
                           "grad_accum": 1, "image_size": 500, "trainable_parameters": parameters,
                           "bucket_mb": 25.0, "first_bucket_mb": 1.0},
                          row.total_s, -(-samples // batch), epochs)
    runs = predict(measured, predicted, link, "ddp-ds")
    print(f"# Table 2 of {paper.SOURCE} predicted from its 1-GPU rows: DDP-DS, batch 64 per rank (assumed), "
          f"{parameters} parameters, link {link} (assumed)")
    print(f"# {'GPUs':>4} {'precision':<9} {'paper':>8} {'predicted':>10} {'error':>7} {'paper eff':>10} "
          f"{'pred eff':>9} {'allreduce':>10}")
    print(f"# {'':>4} {'':<9} {'(s)':>8} {'(s)':>10} {'(%)':>7} {'(%)':>10} {'(%)':>9} {'(ms/step)':>10}")
    for row in paper.TABLE2.itertuples():
        p = runs[(runs["precision"] == row.precision) & (runs["ranks"] == row.ranks)].iloc[0]
        one = runs[(runs["precision"] == row.precision) & (runs["ranks"] == 1)].iloc[0]
        error = 100 * (p["total_s"] - row.total_s) / row.total_s
        print(f"  {row.ranks:>4} {row.precision:<9} {row.total_s:>8.0f} {p['total_s']:>10.0f} {error:>7.1f} "
              f"{100 * row.efficiency_vs_1_rank:>10.1f} {100 * one['total_s'] / p['total_s']:>9.1f} "
              f"{1e3 * p['prediction_allreduce_s_per_step']:>10.3f}")


#: Llama 3 8B (Meta-Llama-3-8B config.json): vocabulary, hidden, intermediate, layers, KV heads x head dim.
LLAMA3_8B = dict(vocab=128256, hidden=4096, intermediate=14336, layers=32, kv=8 * 128)


def llama3_8b_lora_units(rank=8):
    """Llama 3 8B's FSDP units as mgbench shards them (embedding, 32 decoder layers, root norm, output
    head) with TorchTune's llama3/8B_lora adapters (q, v, output projections and the MLP, rank 8):
    per unit (parameters, trainable parameters, freed after forward)."""
    c = LLAMA3_8B
    h, i, kv = c["hidden"], c["intermediate"], c["kv"]
    projections = [(h, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]  # q, v, o, gate, up, down (out, in)
    adapters = sum(rank * n_in + n_out * rank for n_out, n_in in projections)
    layer = 2 * h * h + 2 * kv * h + 3 * i * h + 2 * h + adapters  # q, o, k, v, MLP, two norms, adapters
    embedding = c["vocab"] * h
    return ([(embedding, 0, True)] + [(layer, adapters, True)] * c["layers"] + [(h, 0, False)] +
            [(embedding, 0, False)])


def llama3_8b_lora_collectives(element_bytes):
    """A micro-batch's all-gathers and reduce-scatters [bytes], as train::micro_batch_collectives plans
    them (reshard_after_forward, TorchTune's default): every unit gathered in forward; in backward
    the units freed after forward that a gradient flows through (the decoder layers: the embedding
    is frozen); the layers' adapter gradients reduce-scattered."""
    units = llama3_8b_lora_units()
    gathers = [n * element_bytes for n, _, _ in units]
    flows = False
    backward = []
    for n, trainable, resharded in units:
        flows = flows or trainable > 0
        backward.append(resharded and flows)
    gathers += [n * element_bytes for (n, _, _), again in reversed(list(zip(units, backward))) if again]
    scatters = [t * element_bytes for _, t, _ in reversed(units) if t > 0]
    return gathers, scatters, sum(t for _, t, _ in units)


def table5(link, d):
    """Table 5: Llama-3-8B LoRA on alpaca-cleaned, FP32, batch 2 per GPU, TorchTune's distributed recipe
    (FSDP2) on 2-4 GPUs: the gathers of the parameters and the reduce-scatter of the adapters."""
    samples, batch = 51760, 2  # alpaca-cleaned's rows; an iteration = one batch of 2 per GPU (Table 5's totals)
    gathers, scatters, trainable = llama3_8b_lora_collectives(4)
    measured, predicted = os.path.join(d, "table5.h5"), os.path.join(d, "table5-predicted.h5")
    one = paper.TABLE5[(paper.TABLE5["ranks"] == 1) & (paper.TABLE5["pin_memory"] == "false")].iloc[0]
    write_one_gpu_run(measured, "paper-table5-1gpu",
                      {"task": "llm-finetune", "recipe": "lora", "model": "llama3-8b", "dataset": "alpaca-cleaned",
                       "precision": "fp32", "sharding": "fsdp", "train_samples": samples, "batch_size": batch,
                       "grad_accum": 1, "trainable_parameters": trainable,
                       "fsdp_allgather_bytes": ",".join(map(str, gathers)),
                       "fsdp_reducescatter_bytes": ",".join(map(str, scatters))},
                      float(one.total_s), -(-samples // batch), 1)
    runs = predict(measured, predicted, link, "ddp-ds")
    print(f"# Table 5 of {paper.SOURCE} (pin_memory false) predicted from its 1-GPU row: Llama-3-8B LoRA, FP32, "
          f"batch 2 per GPU, FSDP as TorchTune's distributed recipe ({len(gathers)} all-gathers of "
          f"{sum(gathers) / 1e9:.1f} GB and {len(scatters)} reduce-scatters of {sum(scatters) / 1e6:.1f} MB per "
          f"iteration, none hidden), link {link} (assumed)")
    print(f"# {'GPUs':>4} {'paper':>7} {'predicted':>10} {'paper':>8} {'predicted':>10} {'error':>7} {'allgather':>10} "
          f"{'r-scatter':>10}")
    print(f"# {'':>4} {'(s/it)':>7} {'(s/it)':>10} {'(s)':>8} {'(s)':>10} {'(%)':>7} {'(ms/it)':>10} {'(ms/it)':>10}")
    for row in paper.TABLE5[paper.TABLE5["pin_memory"] == "false"].itertuples():
        p = runs[runs["ranks"] == row.ranks].iloc[0]
        error = 100 * (p["total_s"] - row.total_s) / row.total_s
        print(f"  {row.ranks:>4} {row.s_per_it:>7.2f} {p['s_per_it']:>10.3f} {row.total_s:>8.0f} {p['total_s']:>10.0f} "
              f"{error:>7.1f} {1e3 * p['prediction_allgather_s_per_step']:>10.1f} "
              f"{1e3 * p['prediction_reducescatter_s_per_step']:>10.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link", default="h100-nvlink", help="mgbench predict --link (default h100-nvlink)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        table2(args.link, d)
        print()
        table5(args.link, d)


if __name__ == "__main__":
    main()
