"""The paper's own numbers, for `mgbench-plot --paper` reference points.

Lawenda et al. 2025, "Efficient allocation of image recognition and LLM tasks on multi-GPU system",
arXiv 2503.15252: Table 2 (MobileNetV2 on upscaled MNIST, DDP-DS, pin_memory false), Table 3 (FP32,
pin_memory false / true), Table 5 (Llama3-8B LoRA on alpaca-cleaned, FP32, batch size 2). Read from
paper_values.csv beside this file, the cells `mgbench report --paper` compares with too (one row per
number the paper prints, with its line: paper_values.md). Times in seconds, efficiencies as fractions
(the paper prints percent).
"""
from pathlib import Path

import pandas as pd

SOURCE = "Lawenda et al. 2025 (arXiv 2503.15252)"
CELLS_FILE = Path(__file__).with_name("paper_values.csv")

#: Every cell of paper_values.csv: paper, table, source, line, the setting, metric, value, unit, notes.
CELLS = pd.read_csv(CELLS_FILE, dtype={"pin_memory": str}, keep_default_na=False)


def _table(table: str, setting: str, metrics: dict) -> pd.DataFrame:
    """One of the paper's tables as a frame: a row per (GPUs, setting), a column per metric (renamed by
    `metrics`; percentages as fractions), in the paper's row order; missing cells NaN."""
    cells = CELLS[(CELLS["paper"].astype(str) == "2503.15252") & (CELLS["table"] == table)].copy()
    cells["ranks"] = cells["gpus"].astype(int)
    cells[setting] = cells[setting].astype(str).str.lower()
    cells["value"] = cells["value"].astype(float) / cells["unit"].map(lambda u: 100.0 if u == "%" else 1.0)
    frame = cells.pivot_table(index=["ranks", setting], columns="metric", values="value", sort=False)
    frame = frame.reindex(columns=list(metrics)).rename(columns=metrics).reset_index()
    frame.columns.name = None
    return frame


#: Table 2: GPUs, precision, total time [s], test accuracy [fraction], efficiency vs 1 GPU, vs FP64.
TABLE2 = _table("Table 2", "precision", {"total_time_20_epochs_s": "total_s", "test_accuracy_pct": "test_accuracy",
                                         "efficiency_vs_1_gpu_pct": "efficiency_vs_1_rank",
                                         "efficiency_vs_fp64_pct": "efficiency_vs_fp64"})

#: Table 3: GPUs, pin_memory, total time [s], test accuracy, efficiency vs 1 GPU, vs pin_memory false.
TABLE3 = _table("Table 3", "pin_memory", {"total_time_20_epochs_s": "total_s", "test_accuracy_pct": "test_accuracy",
                                          "efficiency_vs_1_gpu_pct": "efficiency_vs_1_rank",
                                          "efficiency_vs_pin_false_pct": "efficiency_vs_pin_false"})

#: Table 5: GPUs, pin_memory, s/it, total time [s] (the paper's h:mm:ss).
TABLE5 = _table("Table 5", "pin_memory", {"s_per_it": "s_per_it", "total_time_s": "total_s"})
