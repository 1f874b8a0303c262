#!/usr/bin/env python3
"""torchao 0.11's side of bench/micro_quant.cpp: the same operations on the same shapes, bf16, on the
CPU, timed as Google Benchmark times them (repeat until min_time, mean per iteration). Prints JSON
{name: ms} with the names of micro_quant.cpp's benchmarks. Run with the folder TorchTune and
torchao are installed in on PYTHONPATH (bench/compare_quant.sh does)."""
import argparse
import json
import time

import torch
from torchao.dtypes.nf4tensor import to_nf4
from torchao.quantization.qat import Int8DynActInt4WeightQATQuantizer


def timed(fn, min_time):
    fn()  # warm-up
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return 1e3 * elapsed / n


def weight(out, inp):
    torch.manual_seed(0)
    return (torch.randn(out, inp) * 0.02).to(torch.bfloat16)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--min-time", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {}
    with torch.no_grad():
        for out, inp in ((2048, 2048), (8192, 2048)):
            w = weight(out, inp)
            results[f"BM_Nf4/quantize/{out}/{inp}"] = timed(lambda: to_nf4(w, 64, 256), args.min_time)
            q = to_nf4(w, 64, 256)
            results[f"BM_Nf4/dequantize/{out}/{inp}"] = timed(q.get_original_weight, args.min_time)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048, bias=False))
    model[0].weight = torch.nn.Parameter(weight(2048, 2048))
    model = Int8DynActInt4WeightQATQuantizer(groupsize=256).prepare(model)
    x = torch.randn(1, 512, 2048).to(torch.bfloat16).requires_grad_(True)
    grad_y = torch.randn(1, 512, 2048).to(torch.bfloat16)

    def step():
        model[0].weight.grad = None
        x.grad = None
        model(x).backward(grad_y)

    results["BM_QatLinear/512"] = timed(step, args.min_time)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
