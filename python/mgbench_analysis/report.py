"""One row per run, with the efficiencies `mgbench report` prints (modules/report/report.cpp).

The definitions are the report's, so the frames equal its CSV (tested against ``mgbench report --csv``):
- runs are the same workload when their workload identity is (``workload.py``: the attribute list
  both read, what is computed, device and GPU model);
- image runs, "vs 1 rank" = T(1 rank) / T(n ranks): the completed 1-rank runs of the same workload,
  same-strategy ones preferred, their median time among several (repeats); "vs FP64" = T(fp64) /
  T(this precision), the same workload but precision, same strategy and world size, the median alike
  (Lawenda et al. 2025, Table 2);
- LLM runs, "vs 1 rank" = (tokens/s / ranks) / the median tokens/s of the 1-rank runs of the same
  workload and ``warmup_steps_excluded``;
- a multi-rank run without a 1-rank run of its workload has a ``baseline_note`` naming the nearest
  1-rank run of its task and where it differs (the report's '#' note);
- DPO: the reward accuracy and margin at the end: the mean over ranks of each rank's last min(10, steps)
  steps.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import numpy as np
import pandas as pd

from . import workload
from .attributes import display, is_llm, recipe_of, warmup_steps_excluded
from .results import Run, as_runs

MIB = 1024.0 * 1024.0

#: `mgbench report --csv` columns of each table, in its order.
CSV_COLUMNS = {
    "image": ["file", "run_id", "status", "ranks", "nodes", "device", "gpu_model", "nccl_transports", "strategy", "precision", "pin_memory", "image_size", "epochs",
              "batch_size", "total_s", "test_accuracy_pct", "img_per_s", "efficiency_vs_1_rank_pct",
              "efficiency_vs_fp64_pct", "resumes"],
    "llm": ["file", "run_id", "status", "task", "ranks", "nodes", "device", "gpu_model", "nccl_transports", "model", "dataset", "precision", "batch_size", "grad_accum",
            "s_per_it", "tokens_per_s", "padded_tokens_per_s", "efficiency_vs_1_rank_pct", "mfu_pct",
            "ops_per_layer_step", "ops_per_step", "loss", "resumes", "recipe", "sharding", "padding", "peak_memory_mib", "model_state_mib_per_rank", "parameter_bytes_per_rank",
            "gradient_bytes_per_rank", "optimizer_state_bytes_per_rank", "weight_bytes_per_param"],
    "dpo": ["file", "run_id", "status", "ranks", "model", "dataset", "precision", "batch_size", "grad_accum",
            "s_per_it", "tokens_per_s", "padded_tokens_per_s", "peak_memory_mib", "loss", "reward_accuracy_pct",
            "reward_margin", "resumes"],
}


def _usable(run: Run) -> bool:
    return run.status == "completed" and math.isfinite(run.summary["total_s"])


def _a(run: Run, name: str) -> str:
    return display(run.attributes.get(name))


def _image_efficiencies(runs: Sequence[Run]) -> Dict[int, tuple]:
    out = {}
    for i, run in enumerate(runs):
        vs_one = vs_fp64 = math.nan
        if _usable(run):
            identity, fp64_identity = workload.identity(run), workload.identity(run, precision="fp64")
            one_rank, same_strategy, fp64 = [], [], []  # the candidates' times; repeats: their median
            for other in runs:
                if not _usable(other):
                    continue
                same = _a(other, "strategy") == _a(run, "strategy")
                if other.attributes.get("world_size") == 1 and workload.identity(other) == identity:
                    (same_strategy if same else one_rank).append(other.summary["total_s"])
                if (workload.identity(other) == fp64_identity and same
                        and other.attributes.get("world_size") == run.attributes.get("world_size")):
                    fp64.append(other.summary["total_s"])
            one_rank = same_strategy or one_rank  # a same-strategy 1-rank run preferred
            if one_rank:
                vs_one = float(np.median(one_rank)) / run.summary["total_s"]
            if fp64 and _a(run, "precision") != "fp64":
                vs_fp64 = float(np.median(fp64)) / run.summary["total_s"]
        out[i] = (vs_one, vs_fp64)
    return out


def _llm_efficiency(run: Run, runs: Sequence[Run]) -> float:
    if not _usable(run) or not math.isfinite(run.summary["tokens_per_s"]):
        return math.nan
    one_rank = [other.summary["tokens_per_s"] for other in runs
                if is_llm(other) and _usable(other) and other.attributes.get("world_size") == 1
                and workload.identity(other) == workload.identity(run)
                and warmup_steps_excluded(other) == warmup_steps_excluded(run)
                and math.isfinite(other.summary["tokens_per_s"])]
    if not one_rank:
        return math.nan
    return run.summary["tokens_per_s"] / int(run.attributes.get("world_size", 1)) / float(np.median(one_rank))


def baseline_note(run: Run, runs: Sequence[Run]) -> str:
    """Why a completed multi-rank run has no 1-rank baseline among ``runs``: the report's note, naming
    the nearest 1-rank run of its task and where it differs; "" where it has one or nothing of its task
    ran on 1 rank."""
    if not _usable(run) or int(run.attributes.get("world_size", 1)) <= 1:
        return ""
    nearest, nearest_diffs = None, []
    for other in runs:
        if not _usable(other) or other.attributes.get("world_size") != 1 or _a(other, "task") != _a(run, "task"):
            continue
        diffs = workload.differences(run, other)
        if is_llm(run) and warmup_steps_excluded(run) != warmup_steps_excluded(other):  # timed other steps
            diffs.append(("warmup_steps_excluded", str(warmup_steps_excluded(run)), str(warmup_steps_excluded(other))))
        if not diffs:
            return ""
        if nearest is None or len(diffs) <= len(nearest_diffs):
            nearest, nearest_diffs = other, diffs
    if nearest is None:
        return ""
    return (f"{run.run_id}: no 1-rank run of this workload on {workload.hardware(run)}; the nearest, "
            f"{nearest.run_id}, differs in {workload.describe(nearest_diffs)}")


def final_metric(run: Run, name: str) -> float:
    """The mean over ranks of a recipe metric over each rank's last min(10, steps) written steps; NaN
    when the run has no such metric."""
    if name not in run.metric_names:
        return math.nan
    values = []
    for steps in run.steps:
        written = steps[steps[run.metric_names].notna().any(axis=1)]
        values.extend(written[name].to_numpy()[-10:])
    return float(np.mean(values)) if values else math.nan


def runs(source) -> pd.DataFrame:
    """One row per run of the given files, directories or glob patterns (see results.expand), or of
    already read runs: every run attribute under its own name (docs/results-schema.md), ``file``,
    ``run_id``, ``status``, ``error``, the summary's fields, and the report's columns:

    - ``ranks`` (world size), ``recipe`` (resolved for runs written before it was recorded);
    - ``workload``: the run's workload identity (workload.identity: runs of one workload have equal
      texts, so ``frame.groupby("workload")`` groups them); ``baseline_note``: why a multi-rank run has
      no efficiency vs 1 rank ("" otherwise);
    - ``efficiency_vs_1_rank``, ``efficiency_vs_fp64``: fractions (1.0 = 100 %), NaN without a baseline
      (definitions: this module's docstring; for LLM runs the per-rank tokens/s ratio);
    - ``loss``: LLM runs, the evaluation loss where there is one, else the final training loss;
    - ``ops_per_layer_step``: LLM runs, the summary's ``ops_per_step`` (ATen ops of one optimizer step)
      over the attribute ``decoder_layers``, NaN where not counted;
    - ``peak_memory_mib``, ``weight_bytes_per_param``, ``model_state_mib_per_rank`` (parameters +
      gradients + optimizer states one rank holds), ``reward_accuracy``, ``reward_margin`` (fraction),
      ``resumes`` (0 for a run never resumed).

    Raises results.ResultsError naming the file for input that is not an mgbench results file.
    """
    read_runs: List[Run] = as_runs(source)
    image = [r for r in read_runs if not is_llm(r) and r.attributes.get("task") not in ("comm", "prediction")]
    llm = [r for r in read_runs if is_llm(r)]
    image_eff = dict(zip(map(id, image), _image_efficiencies(image).values()))
    rows = []
    for run in read_runs:
        row = dict(run.attributes)
        row.update(file=run.file, run_id=run.run_id, status=run.status, error=run.error)
        row.update(run.summary)
        row["ranks"] = int(run.attributes.get("world_size", len(run.steps) or 1))
        row["recipe"] = recipe_of(run)
        row["workload"] = workload.identity(run)
        row["baseline_note"] = baseline_note(run, read_runs)
        if is_llm(run):
            row["efficiency_vs_1_rank"], row["efficiency_vs_fp64"] = _llm_efficiency(run, llm), math.nan
            row["loss"] = run.summary["eval_loss"] if math.isfinite(run.summary["eval_loss"]) else \
                run.summary["final_loss"]
        elif id(run) in image_eff:
            row["efficiency_vs_1_rank"], row["efficiency_vs_fp64"] = image_eff[id(run)]
            row["loss"] = run.summary["final_loss"]
        else:  # comm and prediction runs
            row["efficiency_vs_1_rank"], row["efficiency_vs_fp64"], row["loss"] = math.nan, math.nan, math.nan
        peak = run.summary["peak_memory_bytes"]
        row["peak_memory_mib"] = peak / MIB if peak >= 0 else math.nan
        row["weight_bytes_per_param"] = float(run.attributes.get("weight_bytes_per_parameter", math.nan))
        ops, layers = run.summary.get("ops_per_step", -1), run.attributes.get("decoder_layers", 0)
        row["ops_per_layer_step"] = ops / layers if ops >= 0 and layers > 0 else math.nan
        state = [run.attributes.get(f"{name}_bytes_per_rank") for name in ("parameter", "gradient", "optimizer_state")]
        row["model_state_mib_per_rank"] = sum(state) / MIB if all(v is not None for v in state) else math.nan
        row["reward_accuracy"] = final_metric(run, "reward_accuracy")
        row["reward_margin"] = final_metric(run, "reward_margin")
        row["resumes"] = int(run.attributes.get("resumes", 0))
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    # Integer attributes stay integers where some runs lack them (image_size of LLM runs): nullable Int64.
    for column in frame.columns:
        values = frame[column].dropna()
        if frame[column].dtype == float and len(values) and all(isinstance(rows[i].get(column), int)
                                                                 for i in values.index):
            frame[column] = frame[column].astype("Int64")
    first = ["file", "run_id", "status", "task", "recipe", "ranks", "strategy", "precision"]
    return frame[[c for c in first if c in frame] + [c for c in frame.columns if c not in first]]


def report_table(frame: pd.DataFrame, table: str = "image") -> pd.DataFrame:
    """The rows and columns of one `mgbench report --csv` table (``image``, ``llm`` or ``dpo``) from a
    :func:`runs` frame: the same names and units (percent where the name ends in ``_pct``, MiB), the
    values unrounded, NaN where the CSV prints "-".

    Raises ValueError for another table name.
    """
    if table not in CSV_COLUMNS:
        raise ValueError(f"report_table(table={table!r}): expected one of {', '.join(CSV_COLUMNS)}")
    if frame.empty:
        return pd.DataFrame(columns=CSV_COLUMNS[table])
    task = frame["task"].astype(str)
    llm = task.str.startswith("llm")
    # comm and prediction runs have tables of their own in `mgbench report`.
    image = ~llm & ~task.isin(["comm", "prediction"])
    rows = frame[image] if table == "image" else frame[llm] if table == "llm" else frame[llm & (frame["recipe"] == "dpo")]
    out = pd.DataFrame(index=rows.index)
    for column in CSV_COLUMNS[table]:
        if column == "img_per_s":
            out[column] = rows["samples_per_s"]
        elif column == "test_accuracy_pct":
            out[column] = rows["test_accuracy"] * 100.0
        elif column == "mfu_pct":
            out[column] = rows["mfu"] * 100.0
        elif column.endswith("_pct"):
            out[column] = rows[column[: -len("_pct")]] * 100.0
        elif column == "ops_per_step":  # -1: not counted
            out[column] = rows[column].where(rows[column] >= 0) if column in rows else math.nan
        elif column == "loss" and table == "dpo":
            out[column] = rows["final_loss"]
        elif column == "padding":  # runs written before --padding existed were padded
            out[column] = rows[column].fillna("pad") if column in rows else "pad"
        else:
            out[column] = rows[column] if column in rows else math.nan
    return out.reset_index(drop=True)
