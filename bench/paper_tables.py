#!/usr/bin/env python3
"""The tables of scripts/gpu-check.sh's paper sets (issue 49), from their results files, beside the
numbers of Lawenda et al. 2025 (arXiv 2503.15252) where the paper has one:

    bench/paper_tables.py table2 OUT/table2.h5        # 20-epoch time projected from the timed epochs
    bench/paper_tables.py table3 OUT/table3.h5        # pin_memory true vs false
    bench/paper_tables.py techniques OUT/techniques.h5  # s/it, peak VRAM, HtoD bytes per step

`mgbench report FILE` prints the runs themselves; this adds what the paper's tables compare.
"""
import argparse
import sys

import h5py

MNIST_TRAIN_IMAGES = 60_000  # the paper's epoch: all of MNIST's training set
PAPER_EPOCHS = 20
# Table 2, 1 GPU (an H100), total time of 20 epochs [s]. The paper's FP32 is PyTorch's default, where
# cuDNN may run convolutions on TF32: mgbench's fp32 (TF32 off) and tf32 (on) both stand beside it.
PAPER_TABLE2_1GPU_S = {"fp64": 6266, "fp32": 3721, "tf32": 3721, "fp16": 2477}
# Table 3, 1 GPU, FP32: pin_memory false 3,792 s, true 2,921 s.
PAPER_TABLE3_1GPU_S = {"false": 3792, "true": 2921}


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def runs(path, prefix=""):
    """(run_name, run group) of the file's runs whose name starts with prefix, in the order they ran."""
    with h5py.File(path, "r") as f:
        for key in f["runs"]:
            run = f["runs"][key]
            name = text(run.attrs.get("run_name", key))
            if name.startswith(prefix):
                yield name, run


def timed_epochs(run):
    """(img/s over the epochs after the first, over all ranks; the number of those epochs; images an
    epoch). The first epoch holds cuDNN's autotuning; with one epoch only, it is all there is."""
    ranks = [run[k]["epochs"][:] for k in run if k.startswith("rank_")]
    ranks = [e[e["epoch"] >= 0] for e in ranks]
    if not ranks or len(ranks[0]) == 0:
        return float("nan"), 0, 0
    timed = [e[1:] if len(e) > 1 else e for e in ranks]
    samples = sum(int(e["samples"].sum()) for e in timed)
    slowest_s = max(float(e["train_s"].sum()) for e in timed)
    per_epoch = sum(int(e["samples"][0]) for e in ranks)
    return samples / slowest_s if slowest_s > 0 else float("nan"), len(timed[0]), per_epoch


def card(run):
    return text(run.attrs.get("gpu_model", run.attrs.get("device", "?"))) or "?"


def table2(path):
    print(f"# Table 2 (2503.15252), 1 GPU: {PAPER_EPOCHS} epochs of {MNIST_TRAIN_IMAGES:,} images projected from "
          "mgbench's timed epochs (training only; the paper's total also holds its evaluations)")
    print(f"# {'precision':<10} {'size':>5} {'batch':>5} {'epochs':>6} {'img/s':>9} {'epoch':>8} {'20 epochs':>10} "
          f"{'paper':>7} {'paper /':>8}  card")
    print(f"# {'':<10} {'(px)':>5} {'':>5} {'timed':>6} {'':>9} {'(s)':>8} {'(s)':>10} {'(s)':>7} {'mgbench':>8}")
    labels = []
    for name, run in runs(path, "table2-"):
        precision = text(run.attrs.get("precision", name[len("table2-"):]))
        img_per_s, epochs, per_epoch = timed_epochs(run)
        epoch_s = MNIST_TRAIN_IMAGES / img_per_s if img_per_s > 0 else float("nan")
        total_s = PAPER_EPOCHS * epoch_s
        paper = PAPER_TABLE2_1GPU_S.get(precision)
        print(f"  {precision:<10} {int(run.attrs.get('image_size', 0)):>5} {int(run.attrs.get('batch_size', 0)):>5} "
              f"{epochs:>6} {img_per_s:>9.1f} {epoch_s:>8.1f} {total_s:>10.0f} "
              f"{paper if paper else '-':>7} {f'{paper / total_s:.2f}' if paper else '-':>8}  {card(run)}")
        labels.append(f"{precision}: projected from {epochs} timed epochs of {per_epoch} images")
    for label in labels:
        print(f"# {label} (the first epoch, cuDNN's autotuning, left out), not run for {PAPER_EPOCHS} epochs")
    print(f"# goal (issue 49): fp16 <= 1/5 of the paper's {PAPER_TABLE2_1GPU_S['fp16']:,} s = "
          f"{PAPER_TABLE2_1GPU_S['fp16'] / 5:.0f} s on an H100 (on another card, times that card's ratio to an H100)")


def table3(path):
    rows = {}
    for name, run in runs(path, "table3-"):
        pin = "true" if bool(run.attrs.get("pin_memory", name.endswith("true"))) else "false"
        rows[pin] = (run["summary"][0]["samples_per_s"], card(run), text(run.attrs.get("upscale", "?")))
    print("# Table 3 (2503.15252), 1 GPU, fp32: pin_memory false vs true (summary img/s, warm-up excluded)")
    for pin, (img_per_s, gpu, upscale) in rows.items():
        print(f"  pin_memory {pin:<5} {img_per_s:>9.1f} img/s   upscale {upscale}, {gpu}")
    if len(rows) == 2:
        paper = PAPER_TABLE3_1GPU_S["false"] / PAPER_TABLE3_1GPU_S["true"]
        print(f"# true / false: {rows['true'][0] / rows['false'][0]:.2f} (paper, 1 GPU: {paper:.2f})")


def techniques(path):
    print("# fine-tuning techniques, 1 GPU (2505.22905's comparison): s/it after the warm-up steps, peak VRAM "
          "(the caching allocator's), HtoD per step (training batches) and in all (CUPTI's window)")
    print(f"# {'model':<13} {'recipe':<7} {'s/it':>8} {'peak VRAM':>10} {'HtoD/step':>11} {'HtoD all':>10} "
          f"{'trainable':>13}  card")
    print(f"# {'':<13} {'':<7} {'':>8} {'(GiB)':>10} {'(bytes)':>11} {'(MiB)':>10} {'(params)':>13}")
    for name, run in runs(path):
        summary = run["summary"][0]
        steps = run["rank_0"]["steps"][:]
        steps = int((steps["epoch"] >= 0).sum()) or 1
        if "cuda_summary" in run["rank_0"]:
            cuda = run["rank_0"]["cuda_summary"][0]
            per_step, total = f"{cuda['htod_train_bytes'] / steps:.0f}", f"{cuda['htod_bytes'] / 2**20:.1f}"
        else:
            per_step, total = "-", "-"
        print(f"  {text(run.attrs.get('model', name)):<13} {text(run.attrs.get('recipe', '?')):<7} "
              f"{summary['s_per_it']:>8.3f} {summary['peak_memory_bytes'] / 2**30:>10.2f} {per_step:>11} {total:>10} "
              f"{int(run.attrs.get('trainable_parameters', -1)):>13}  {card(run)}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("table", choices=["table2", "table3", "techniques"])
    p.add_argument("results", help="the set's HDF5 results file")
    a = p.parse_args()
    {"table2": table2, "table3": table3, "techniques": techniques}[a.table](a.results)


if __name__ == "__main__":
    sys.exit(main())
