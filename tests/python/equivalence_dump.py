"""What bench/compare_binaries.sh compares bitwise between two mgbench binaries: per run and rank the
step losses, learning rates, loss scales, batch indices, samples, test accuracy and evaluation loss
(exact reprs), the recipe metrics (their bytes' SHA-256), the comm check's wrong counts; per adapter
file every tensor's SHA-256. Prints one line per fact, in a fixed order.
    python equivalence_dump.py DIR        (DIR/r.h5, DIR/lora*, DIR/dpo)"""
import hashlib
import os
import sys

import h5py
from safetensors.numpy import load_file


def dump(out: str) -> None:
    with h5py.File(os.path.join(out, "r.h5"), "r") as f:
        for run_id in sorted(f["runs"]):
            run = f["runs"][run_id]
            print("run", run_id, run.attrs.get("task"))
            for rank in sorted(k for k in run if k.startswith("rank_")):
                group = run[rank]
                if "steps" in group:
                    steps = group["steps"][()]
                    for field in ("loss", "lr", "loss_scale", "batch_index", "samples", "tokens", "skipped"):
                        print(" ", rank, field, [repr(float(x)) for x in steps[field]])
                if "epochs" in group:
                    epochs = group["epochs"][()]
                    for field in ("loss_mean", "test_accuracy", "test_correct", "eval_loss", "samples"):
                        print(" ", rank, field, [repr(float(x)) for x in epochs[field]])
                if "metrics" in group:
                    print(" ", rank, "metrics", hashlib.sha256(group["metrics"][()].tobytes()).hexdigest())
                if "comm" in group:
                    print(" ", rank, "comm wrong", [int(x) for x in group["comm"]["wrong"]])
            if "summary" in run:
                summary = run["summary"][0]
                for field in ("final_loss", "test_accuracy", "eval_loss", "epochs_completed"):
                    print("  summary", field, repr(summary[field].item()))
    for name in sorted(os.listdir(out)):
        adapter = os.path.join(out, name)
        if not os.path.isdir(adapter):
            continue
        for file in sorted(os.listdir(adapter)):
            if file.endswith(".safetensors"):
                tensors = load_file(os.path.join(adapter, file))
                for key in sorted(tensors):
                    print(name, file, key, hashlib.sha256(tensors[key].tobytes()).hexdigest())


if __name__ == "__main__":
    dump(sys.argv[1])
