"""The paper's own numbers, for `mgbench-plot --paper` reference points.

Lawenda et al. 2025, "Efficient allocation of image recognition and LLM tasks on multi-GPU system",
arXiv 2503.15252: Table 2 (MobileNetV2 on upscaled MNIST, DDP-DS, pin_memory false), Table 3 (FP32,
pin_memory false / true), Table 5 (Llama3-8B LoRA on alpaca-cleaned, FP32, batch size 2). Times in
seconds, efficiencies as fractions (the paper prints percent).
"""
import pandas as pd

SOURCE = "Lawenda et al. 2025 (arXiv 2503.15252)"

#: Table 2: GPUs, precision, total time [s], test accuracy [fraction], efficiency vs 1 GPU, vs FP64.
TABLE2 = pd.DataFrame(
    [(1, "fp64", 6266, 0.9943, 1.0000, None), (1, "fp32", 3721, 0.9932, 1.0000, 1.6838),
     (1, "fp16", 2477, 0.9957, 1.0000, 2.5293), (2, "fp64", 3339, 0.9920, 1.8766, None),
     (2, "fp32", 2094, 0.9924, 1.7769, 1.5945), (2, "fp16", 1445, 0.9794, 1.7141, 2.3107),
     (3, "fp64", 2318, 0.9870, 2.7031, None), (3, "fp32", 1483, 0.9903, 2.5091, 1.5630),
     (3, "fp16", 1049, 0.9921, 2.3612, 2.2097), (4, "fp64", 1937, 0.9932, 3.2348, None),
     (4, "fp32", 1256, 0.9888, 2.9625, 1.5421), (4, "fp16", 919, 0.9920, 2.6953, 2.1077)],
    columns=["ranks", "precision", "total_s", "test_accuracy", "efficiency_vs_1_rank", "efficiency_vs_fp64"])

#: Table 3: GPUs, pin_memory, total time [s], test accuracy, efficiency vs 1 GPU, vs pin_memory false.
TABLE3 = pd.DataFrame(
    [(1, "false", 3792, 0.9930, 1.0000, None), (1, "true", 2921, 0.9941, 1.0000, 1.2978),
     (2, "false", 2205, 0.9924, 1.7193, None), (2, "true", 1733, 0.9948, 1.6856, 1.2723),
     (3, "false", 1579, 0.9930, 2.4001, None), (3, "true", 1283, 0.9870, 2.2757, 1.2305),
     (4, "false", 1358, 0.9920, 2.7908, None), (4, "true", 1165, 0.9936, 2.5079, 1.1662)],
    columns=["ranks", "pin_memory", "total_s", "test_accuracy", "efficiency_vs_1_rank", "efficiency_vs_pin_false"])

#: Table 5: GPUs, pin_memory, s/it, total time [s] (the paper's h:mm:ss).
TABLE5 = pd.DataFrame(
    [(1, "false", 0.77, 5 * 3600 + 31 * 60 + 52), (1, "true", 0.77, 5 * 3600 + 31 * 60 + 44),
     (2, "false", 0.93, 3 * 3600 + 20 * 60 + 30), (2, "true", 0.92, 3 * 3600 + 17 * 60 + 21),
     (3, "false", 0.90, 2 * 3600 + 9 * 60 + 55), (3, "true", 0.90, 2 * 3600 + 9 * 60 + 57),
     (4, "false", 0.94, 1 * 3600 + 41 * 60 + 32), (4, "true", 0.91, 1 * 3600 + 37 * 60 + 58)],
    columns=["ranks", "pin_memory", "s_per_it", "total_s"])
