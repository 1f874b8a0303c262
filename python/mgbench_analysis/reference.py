"""The regression check of `mgbench report --reference REF --tolerance PCT FILES` (report/reference.h)
as a frame: each workload of the runs beside the reference's of the same workload identity
(``workload.py``) and the same ranks, nodes, strategy, backend and warm-up steps excluded; per metric the medians over the
runs of each side, their ratio (measured / reference) and a verdict -- ``holds``, ``improved``,
``REGRESSED`` (slower than the reference by more than the tolerance) or ``FAILED`` (a run of either
side that did not complete). One rule for every metric: its slowdown, the ratio of a lower-is-better
metric or the inverse of a higher-is-better one, regresses above 1 + tolerance and improves below
1 / (1 + tolerance). :func:`exit_status` is the report's exit status.
"""
from __future__ import annotations

import math
import os
from typing import Dict, List, Tuple

import numpy as np
import pandas as pd

from . import workload
from .attributes import display, is_llm, recipe_of, warmup_steps_excluded
from .results import ResultsError, Run, as_runs

#: The columns of ``mgbench report --reference --csv``, in its order.
COLUMNS = ["run_id", "workload", "ranks", "device", "metric", "better", "reference", "measured", "ratio",
           "reference_runs", "measured_runs", "verdict", "reference_run_id"]
MIB = 1024.0 * 1024.0


def _completed(run: Run) -> bool:
    return run.status == "completed" and math.isfinite(run.summary["total_s"])


def _a(run: Run, name: str) -> str:
    return display(run.attributes.get(name))


def _metrics(run: Run) -> List[Tuple[str, bool, float]]:
    """(metric, higher is better, value) of a completed run, finite and positive values only."""
    out = []

    def add(metric, higher, value):
        if value is not None and math.isfinite(value) and value > 0:
            out.append((metric, higher, float(value)))

    peak = run.summary["peak_memory_bytes"]
    peak_mib = peak / MIB if peak >= 0 else math.nan
    if _a(run, "task") == "comm":
        largest: Dict[str, Tuple[int, float]] = {}
        first = run.comm[0] if run.comm else pd.DataFrame()
        for i, row in first.iterrows():
            times = [float(r.loc[i, "time_s"]) for r in run.comm if i < len(r)]
            algbw = row["bytes"] / float(np.mean(times)) / 1e9
            busbw = algbw * row["busbw_gbs"] / row["algbw_gbs"] if row["time_s"] > 0 else math.nan
            key = f"{row['collective']}:{row['dtype']}:{'in-place' if row['in_place'] else 'out-of-place'}"
            if key not in largest or row["bytes"] > largest[key][0]:
                largest[key] = (int(row["bytes"]), busbw)
        for key, (size, busbw) in largest.items():
            add(f"busbw:{key}:{size}B", True, busbw)
    elif is_llm(run):
        add("tokens/s", True, run.summary["tokens_per_s"])
        add("s/it", False, run.summary["s_per_it"])
        add("peak_MiB", False, peak_mib)
    else:
        add("img/s", True, run.summary["samples_per_s"])
        epochs = int(run.attributes.get("epochs", 0) or 0)
        add("s/epoch", False, run.summary["total_s"] / epochs if epochs > 0 else math.nan)
        add("peak_MiB", False, peak_mib)
    return out


def _group(run: Run) -> str:
    return (f"{workload.identity(run)}|ranks={_a(run, 'world_size')}|nodes={_a(run, 'nodes')}"
            f"|strategy={_a(run, 'strategy')}|backend={_a(run, 'backend')}"
            f"|warmup_steps_excluded={warmup_steps_excluded(run)}")


def _short(run: Run) -> str:
    if _a(run, "task") == "comm":
        return _a(run, "backend")
    if is_llm(run):
        return f"{recipe_of(run)}/{_a(run, 'precision')}/{_a(run, 'batch_size')}x{_a(run, 'grad_accum')}"
    return f"{_a(run, 'precision')}/{_a(run, 'image_size')}px/{_a(run, 'strategy')}"


def _verdict(ratio: float, higher: bool, tolerance: float) -> str:
    slowdown = 1.0 / ratio if higher else ratio
    if slowdown > 1.0 + tolerance:
        return "REGRESSED"
    if slowdown < 1.0 / (1.0 + tolerance):
        return "improved"
    return "holds"


def _status_row(run: Run, reference_run_id: str) -> dict:
    """The row of a run that did not complete (either side): nothing of it can be judged."""
    return dict(run_id=run.run_id, workload=_short(run), ranks=run.world_size, device=workload.hardware_cell(run),
                metric="status", better="higher", reference=math.nan, measured=math.nan, ratio=math.nan,
                reference_runs=0, measured_runs=0, verdict="FAILED", reference_run_id=reference_run_id)


def _predicted(run: Run) -> bool:
    """A run of `mgbench predict`: no measurement to judge, judge by, or repeat."""
    return run.attributes.get("task") == "prediction"


def compare(reference, source, tolerance: float = 0.10) -> pd.DataFrame:
    """The runs of ``source`` beside those of ``reference`` (files, directories, patterns or Runs):
    one row per workload and metric, columns COLUMNS (the report's CSV, unrounded); ``tolerance`` a
    fraction (0.1 = 10 %). Runs without a reference of their workload are left out (the report's
    notes); ``passed(frame)`` is the report's exit status 0. Predicted runs (`mgbench predict`'s) are left
    out of both.

    Raises ResultsError for a run among both (it would be judged by itself: everything holds; `mgbench
    report --reference` takes whole files, and refuses a file on both sides), ValueError for a
    tolerance that is not a finite fraction above 0 (the report's --tolerance bound)."""
    try:
        fraction = float(tolerance)
    except (TypeError, ValueError):
        fraction = math.nan
    if not (math.isfinite(fraction) and fraction > 0):
        raise ValueError(f"tolerance {tolerance!r}: expected a fraction above 0 (0.1 = 10 %)")
    tolerance = fraction
    reference_runs, source_runs = as_runs(reference), as_runs(source)
    both = {(os.path.realpath(r.file), r.run_id) for r in reference_runs} & \
        {(os.path.realpath(r.file), r.run_id) for r in source_runs}
    if both:
        file, run_id = sorted(both)[0]
        raise ResultsError(f"'{file}' is among both the reference and the files judged (run {run_id}): its runs "
                           "would be compared with themselves; give the reference apart")
    refs: Dict[str, List[Run]] = {}
    rows, measured = [], {}
    for run in reference_runs:
        if _predicted(run):
            continue
        if _completed(run):
            refs.setdefault(_group(run), []).append(run)
        else:
            rows.append(_status_row(run, run.run_id))
    for run in source_runs:
        if _predicted(run):
            continue
        group = _group(run)
        if not _completed(run):
            ref = refs.get(group)
            rows.append(_status_row(run, ref[-1].run_id if ref else "-"))
        elif group in refs:
            measured.setdefault(group, []).append(run)
    for group, mine in measured.items():
        theirs = refs[group]
        for metric, higher, _ in _metrics(mine[-1]):
            a = [v for r in mine for m, _, v in _metrics(r) if m == metric]
            b = [v for r in theirs for m, _, v in _metrics(r) if m == metric]
            if not a or not b:
                continue
            value, ref = float(np.median(a)), float(np.median(b))
            rows.append(dict(run_id=mine[-1].run_id, workload=_short(mine[-1]), ranks=mine[-1].world_size,
                             device=workload.hardware_cell(mine[-1]), metric=metric, better="higher" if higher else "lower",
                             reference=ref, measured=value, ratio=value / ref, reference_runs=len(b),
                             measured_runs=len(a), verdict=_verdict(value / ref, higher, tolerance),
                             reference_run_id=theirs[-1].run_id))
    return pd.DataFrame(rows, columns=COLUMNS)


#: The columns of the repeats table of ``mgbench report --csv``, in its order.
REPEAT_COLUMNS = ["run_id", "workload", "ranks", "device", "metric", "runs", "median", "min", "max", "cv_pct"]


def repeats(source) -> pd.DataFrame:
    """The spread of every workload with several completed runs in ``source`` (the same identity, ranks,
    nodes, strategy and backend), one row per metric of its latest run: REPEAT_COLUMNS, as the report's
    repeats table (cv = sample standard deviation / mean, in percent)."""
    groups: Dict[str, List[Run]] = {}
    for run in as_runs(source):
        if _completed(run) and not _predicted(run):
            groups.setdefault(_group(run), []).append(run)
    rows = []
    for members in groups.values():
        if len(members) < 2:
            continue
        latest = members[-1]
        for metric, _, _ in _metrics(latest):
            values = np.array([v for r in members for m, _, v in _metrics(r) if m == metric])
            if len(values) < 2:
                continue
            rows.append(dict(run_id=latest.run_id, workload=_short(latest), ranks=latest.world_size,
                             device=workload.hardware_cell(latest), metric=metric, runs=len(values), median=float(np.median(values)),
                             min=float(values.min()), max=float(values.max()),
                             cv_pct=float(values.std(ddof=1) / values.mean() * 100.0)))
    return pd.DataFrame(rows, columns=REPEAT_COLUMNS)


def passed(frame: pd.DataFrame) -> bool:
    """True where `mgbench report --reference` exits 0 (:func:`exit_status`): something was compared,
    and no row regressed or failed. An empty frame compared nothing: not passed (was: True)."""
    return exit_status(frame) == 0


def exit_status(frame: pd.DataFrame) -> int:
    """`mgbench report --reference`'s exit status for a :func:`compare` frame: 2 a run did not complete
    (a FAILED row) or nothing was compared (an empty frame), 1 a metric regressed, 0 every metric holds
    or improved."""
    if frame.empty or (frame["verdict"] == "FAILED").any():
        return 2
    return 1 if (frame["verdict"] == "REGRESSED").any() else 0
