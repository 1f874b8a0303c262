"""Model check of `mgbench predict` against the paper (Lawenda et al. 2025, arXiv 2503.15252, Table 2):
from its 1-GPU rows and an assumed H100 link, predict its 2-4 GPU rows and say how close the model
lands. A model check, not a measurement: the paper gives only total times, so each 1-GPU run is
written as a results file whose training time is all compute (no phase split, no evaluation), with
the workload of inputs/configs/paper-table2.ini (DDP-DS, 20 epochs, 60,000 images, batch 64 per rank,
MobileNetV2 for 10 classes on 1 channel: its parameters counted from torchvision's model).

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


def write_one_gpu_run(path, precision, total_s, parameters):
    epochs, samples, batch = 20, 60000, 64
    steps = -(-samples // batch)
    string = h5py.string_dtype()
    with h5py.File(path, "a") as f:
        f.attrs["schema"] = "mgbench-results"
        f.attrs["schema_version"] = np.int64(4)
        run = f.create_group(f"runs/paper-table2-1gpu-{precision}")
        for name, value in {"task": "image", "strategy": "ddp-ds", "precision": precision, "pin_memory": "false",
                            "drop_last": "false", "run_id": run.name.split("/")[-1]}.items():
            run.attrs.create(name, value, dtype=string)
        for name, value in {"world_size": 1, "train_samples": samples, "batch_size": batch, "grad_accum": 1,
                            "epochs": epochs, "max_steps": 0, "image_size": 500, "trainable_parameters": parameters,
                            "schema_version": 4}.items():
            run.attrs[name] = np.int64(value)
        run.attrs["bucket_mb"], run.attrs["first_bucket_mb"] = 25.0, 1.0
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link", default="h100-nvlink", help="mgbench predict --link (default h100-nvlink)")
    args = parser.parse_args()
    parameters = mobilenet_v2_parameters()
    with tempfile.TemporaryDirectory() as d:
        measured, predicted = os.path.join(d, "paper.h5"), os.path.join(d, "predicted.h5")
        for row in paper.TABLE2[paper.TABLE2["ranks"] == 1].itertuples():
            write_one_gpu_run(measured, row.precision, row.total_s, parameters)
        subprocess.run([MGBENCH, "predict", measured, "--link", args.link, "--ranks", "1,2,3,4", "--strategies",
                        "ddp-ds", "--results", predicted], check=True, stdout=subprocess.DEVNULL)
        runs = mga.runs(predicted)
    print(f"# Table 2 of {paper.SOURCE} predicted from its 1-GPU rows: DDP-DS, batch 64 per rank (assumed), "
          f"{parameters} parameters, link {args.link} (assumed)")
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


if __name__ == "__main__":
    main()
