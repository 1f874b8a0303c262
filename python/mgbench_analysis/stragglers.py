"""Stragglers of multi-rank runs, as `mgbench report --phases` names them (report/stragglers.h): the
ranks whose own time -- training time outside the step's collectives (the allreduce, buffer_broadcast
and loss_reduce phases, where the faster ranks wait for the slower) -- exceeds the other ranks'
median by more than STRAGGLER_MARGIN, with host, GPU and the phase that makes the difference."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .results import PHASES, as_runs

#: Relative excess over the other ranks' median own time that makes a straggler (the report's).
STRAGGLER_MARGIN = 0.20
_COLLECTIVES = ("allreduce_s", "buffer_broadcast_s", "loss_reduce_s")
_OWN_PHASES = tuple(name for name, f in PHASES if f not in _COLLECTIVES)
COLUMNS = ["file", "run_id", "rank", "host", "gpu_pci_bus_id", "own_s", "others_median_s", "excess_pct", "phase",
           "phase_excess_s"]


def _own_times(epochs: pd.DataFrame) -> dict:
    own = float((epochs["train_s"] - sum(epochs[c] for c in _COLLECTIVES)).sum())
    phases = {p: float(epochs[p + "_s"].sum()) for p in _OWN_PHASES}
    phases["other"] = max(0.0, own - sum(phases.values()))
    return {"own": own, "phases": phases}


def stragglers(source, margin: float = STRAGGLER_MARGIN) -> pd.DataFrame:
    """One row per straggling rank of every multi-rank run of `source` (files, directories, patterns or
    Runs), slowest first within a run: columns COLUMNS; empty when no rank straggles."""
    rows = []
    for run in as_runs(source):
        if len(run.epochs) < 2 or any(e.empty for e in run.epochs):
            continue
        ranks = [_own_times(e) for e in run.epochs]
        found = []
        for r, mine in enumerate(ranks):
            others = [q for k, q in enumerate(ranks) if k != r]
            reference = float(np.median([q["own"] for q in others]))
            if not mine["own"] > (1.0 + margin) * reference:
                continue
            excess = {p: v - float(np.median([q["phases"][p] for q in others])) for p, v in mine["phases"].items()}
            phase = max(excess, key=excess.get)
            attrs = run.rank_attributes[r] if r < len(run.rank_attributes) else {}
            found.append(dict(file=run.file, run_id=run.run_id, rank=r, host=str(attrs.get("hostname", "")),
                              gpu_pci_bus_id=str(attrs.get("gpu_pci_bus_id", "")), own_s=mine["own"],
                              others_median_s=reference, excess_pct=100.0 * (mine["own"] / reference - 1.0),
                              phase=phase, phase_excess_s=excess[phase]))
        rows.extend(sorted(found, key=lambda row: -row["own_s"]))
    return pd.DataFrame(rows, columns=COLUMNS)
