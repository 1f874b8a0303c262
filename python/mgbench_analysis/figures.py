"""The figures of Lawenda et al. 2025 (arXiv 2503.15252), and what the paper lacks, from mgbench results.

One descriptor per figure (:class:`FigureSpec`, as nccl-tests has one per collective): its file name,
what runs it needs (the line printed when it is skipped), and a function that draws it from the data
or returns None when the data do not support it. A new figure is one function and one entry in
:data:`FIGURES`.

Every plotted series is an artist labelled with what it shows (a Line2D or BarContainer whose label is
the strategy, rank count, precision, phase, ...), so the figures' data can be read back from the
artists (tests/python/test_analysis.py does). Values are means over repeated runs of one point.
"""
from __future__ import annotations

import functools
import textwrap
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from . import paper, workload
from .report import runs as runs_frame
from .results import PHASES, Run, as_runs, comm, cuda, epochs, steps

# A figure's runs are one workload (workload.ATTRIBUTES, as `mgbench report`, and the strategy)
# but its plotted axes; its title names these of them.
IMAGE_WORKLOAD = ["strategy", "precision", "pin_memory", "image_size", "epochs", "batch_size", "train_samples"]
LLM_WORKLOAD = ["recipe", "model", "precision", "batch_size", "grad_accum", "max_seq_len"]


def _workload_keys(frame: pd.DataFrame, varied: Sequence[str]) -> List[str]:
    """The strategy and the identity's attributes the frame has, less the plotted axes `varied`."""
    return [k for k in ["strategy", *workload.ATTRIBUTES] if k not in varied and k in frame.columns]
# The CUPTI API rows `mgbench report --cuda` counts as kernel launches and as the host's waits for the
# device (results/schema.h kLaunchApis, kHostWaitApis): the paper's eager PyTorch launched through
# cudaLaunchKernel and waited in cudaStreamSynchronize; mgbench's CUDA graphs launch through
# cudaGraphLaunch, its driver-level launches through cuLaunchKernel, and some waits are on events.
LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
               "cuGraphLaunch")
HOST_WAIT_APIS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")
LAUNCHES, HOST_WAITS = "kernel launches", "host waits"
# The four metrics of the paper's Fig. 3 (Nsight Systems there, CUPTI here): its cudaLaunchKernel and
# cudaStreamSynchronize rows are mgbench's LAUNCHES and HOST_WAITS.
FIG3_METRICS = ("CUDA memcpy HtoD", LAUNCHES, HOST_WAITS, "NCCL kernels")


class Data:
    """The frames the figures are drawn from, read once from the runs."""

    def __init__(self, runs: Sequence[Run]):
        self.run_list = list(runs)

    @functools.cached_property
    def runs(self) -> pd.DataFrame:
        frame = runs_frame(self.run_list) if self.run_list else pd.DataFrame()
        if not frame.empty:
            frame["label"] = run_labels(frame)
        return frame

    @functools.cached_property
    def steps(self) -> pd.DataFrame:
        return steps(self.run_list)

    @functools.cached_property
    def epochs(self) -> pd.DataFrame:
        return epochs(self.run_list)

    @functools.cached_property
    def cuda_summary(self) -> pd.DataFrame:
        return cuda(self.run_list, "summary")

    @functools.cached_property
    def cuda_api(self) -> pd.DataFrame:
        return cuda(self.run_list, "api")

    @functools.cached_property
    def comm(self) -> pd.DataFrame:
        return comm(self.run_list)

    def completed(self, llm: bool) -> pd.DataFrame:
        """Completed runs with a finite total time, image (llm=False) or LLM (llm=True) ones."""
        frame = self.runs
        if frame.empty:
            return frame
        task = frame["task"].astype(str)
        trained = ~task.isin(["comm", "prediction"])  # the benchmark's and the predictor's runs have no epochs
        return frame[(frame["status"] == "completed") & np.isfinite(frame["total_s"]) & trained &
                     (task.str.startswith("llm") == llm)]


@dataclass(frozen=True)
class FigureSpec:
    name: str  # file name without extension (the paper's figure number where it has one)
    title: str
    needs: str  # what runs the figure needs: printed when it is skipped
    draw: Callable[[Data, bool], Optional[Figure]]  # (data, paper overlay) -> figure, or None to skip


def run_labels(frame: pd.DataFrame) -> List[str]:
    """Short, unique labels of runs: image "ddp-ds 2r fp32 224px pin", LLM "lora alpaca 2r bf16"."""
    labels = []
    for _, r in frame.iterrows():
        if str(r.get("task", "")).startswith("llm"):
            label = f"{r['recipe']} {r.get('dataset', '')} {r['ranks']}r {r.get('precision', '')}"
        else:
            label = f"{r.get('strategy', '')} {r['ranks']}r {r.get('precision', '')} {r.get('image_size', '')}px"
            if str(r.get("pin_memory", "")) == "true":
                label += " pin"
        labels.append(label)
    seen: Dict[str, int] = {}
    for i, label in enumerate(labels):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1 or labels.count(label) > 1:
            labels[i] = f"{label} #{seen[label]}"
    return labels


def _choose(frame: pd.DataFrame, keys: List[str], ok: Callable[[pd.DataFrame], bool],
            prefer: Callable[[tuple, pd.DataFrame], tuple]) -> Optional[pd.DataFrame]:
    """The group of runs (equal in `keys`) that `ok` accepts and `prefer` ranks highest; None if none."""
    best, best_rank = None, None
    for key, group in frame.groupby([k for k in keys], dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        if not ok(group):
            continue
        rank = prefer(dict(zip(keys, key)), group)
        if best_rank is None or rank > best_rank:
            best, best_rank = group, rank
    return best


def _describe(group: pd.DataFrame, keys: Sequence[str]) -> str:
    first = group.iloc[0]
    parts = []
    for k in keys:
        v = first.get(k)
        if k == "image_size":
            parts.append(f"{v} px")
        elif k == "pin_memory":
            parts.append(f"pin_memory {v}")
        elif k == "epochs":
            parts.append(f"{v} epoch(s)")
        elif k == "batch_size":
            parts.append(f"batch {v}/rank")
        elif k == "train_samples":
            parts.append(f"{v} samples")
        elif k == "grad_accum":
            parts.append(f"grad-accum {v}")
        elif k == "max_seq_len":
            parts.append(f"max_seq_len {v}" if v else "no max_seq_len")
        elif k == "model":
            parts.append(str(v).rstrip("/").rsplit("/", 1)[-1])
        else:
            parts.append(str(v))
    return ", ".join(parts)


def _series(group: pd.DataFrame, by: str, x: str, y: str) -> Dict[object, pd.DataFrame]:
    """For each value of `by`, the median, min and max of `y` over the runs at each `x` (sorted; repeats
    of a point give its spread), NaNs dropped."""
    out = {}
    for value, sub in group.groupby(by, sort=True):
        s = sub.groupby(x)[y].agg(["median", "min", "max"]).dropna()
        if not s.empty:
            out[value] = s
    return out


# One colour per strategy, precision, rank count, ...: the same in every panel and for the paper's points.
_PALETTE = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
            "tab:cyan", "tab:gray"]
_KNOWN = ["ddp", "ddp-rr", "ddp-ds", "dp", "fp64", "fp32", "fp16", "bf16", "amp-fp16", "amp-bf16"]


def color(value) -> str:
    """The colour of a series value: fixed for strategies and precisions, by value otherwise."""
    value = str(value)
    index = _KNOWN.index(value) if value in _KNOWN else sum(map(ord, value))
    return _PALETTE[index % len(_PALETTE)]


def _plot_series(ax, series: Dict[object, pd.DataFrame], scale: float = 1.0, prefix: str = "", marker="o") -> None:
    """The medians as lines; where a point was run more than once, a bar from its min to its max."""
    for value, s in series.items():
        c = color(f"{prefix}{value}" if prefix else value)
        x, median = s.index.to_numpy(), s["median"].to_numpy() * scale
        ax.plot(x, median, marker=marker, label=f"{prefix}{value}", color=c)
        spread = (s["max"] > s["min"]).to_numpy()
        if spread.any():
            low, high = s["min"].to_numpy() * scale, s["max"].to_numpy() * scale
            ax.errorbar(x[spread], median[spread], yerr=[(median - low)[spread], (high - median)[spread]],
                        linestyle="none", color=c, capsize=3, label="_spread")


def _ideal_speedup(ax, ranks) -> None:
    ranks = sorted(set(ranks))
    ax.plot(ranks, [100.0 * r for r in ranks], color="grey", linestyle=":", label="_ideal")


def _finish(fig: Figure, title: str) -> Figure:
    fig.suptitle("\n".join(textwrap.wrap(title, width=int(fig.get_figwidth() * 11))))
    for ax in fig.axes:
        handles, labels = ax.get_legend_handles_labels()
        if handles and len(handles) <= 16 and ax.get_legend() is None:
            ax.legend(fontsize="small")
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def _rank_counts(group: pd.DataFrame) -> int:
    return group["ranks"].nunique()


def _image_group(data: Data, varied: Sequence[str], ok: Callable[[pd.DataFrame], bool],
                 prefer: Callable[[dict, pd.DataFrame], tuple], strategy: Optional[str] = None):
    """The completed image runs of one workload (equal in IMAGE_WORKLOAD but the `varied` axes) that
    `ok` accepts and `prefer` ranks highest, and the keys that define it; (None, keys) when none."""
    image = data.completed(llm=False)
    if strategy is not None and not image.empty:
        image = image[image["strategy"] == strategy]
    keys = [k for k in IMAGE_WORKLOAD if k not in varied]  # the title's
    if image.empty:
        return None, keys
    return _choose(image, _workload_keys(image, varied), ok, prefer), keys


def _paper_points(ax, x, y, label: str, value=None) -> None:
    """The paper's own numbers (--paper): dashed lines of hollow squares, in the series' colour."""
    ax.plot(x, y, linestyle="--", marker="s", fillstyle="none", label=label,
            color=color(value) if value is not None else "black")


# --- Fig. 1: strategy scaling ----------------------------------------------------------------------

def fig1_strategy_scaling(data: Data, overlay: bool) -> Optional[Figure]:
    # The paper's Fig. 1: FP32, pin_memory false, the largest image size; then the most strategies.
    group, keys = _image_group(data, ["strategy"], lambda g: _rank_counts(g) >= 2,
                               lambda k, g: (k["precision"] == "fp32", k["pin_memory"] == "false",
                                             g["strategy"].nunique(), k["image_size"], len(g)))
    if group is None:
        return None
    fig = Figure(figsize=(11, 4.2))
    left, right = fig.subplots(1, 2)
    _plot_series(left, _series(group, "strategy", "ranks", "total_s"))
    left.set(xlabel="ranks (GPUs)", ylabel="total time (s)", title="time to train and evaluate")
    _plot_series(right, _series(group, "strategy", "ranks", "efficiency_vs_1_rank"), scale=100.0)
    _ideal_speedup(right, group["ranks"])
    right.set(xlabel="ranks (GPUs)", ylabel="efficiency vs 1 rank (%)", title="T(1 rank) / T(n ranks)")
    for ax in (left, right):
        ax.set_xticks(sorted(group["ranks"].unique()))
    return _finish(fig, f"Fig. 1: strategy scaling ({_describe(group, keys)})")


# --- Fig. 2: time and efficiency vs image size ---------------------------------------------------

def fig2_time_efficiency_vs_size(data: Data, overlay: bool) -> Optional[Figure]:
    group, keys = _image_group(data, ["strategy", "image_size"],
                               lambda g: g["image_size"].nunique() >= 2 and _rank_counts(g) >= 2,
                               lambda k, g: (k["precision"] == "fp64", k["pin_memory"] == "false",
                                             g["image_size"].nunique(), len(g)), strategy="ddp-ds")
    if group is None:
        return None
    fig = Figure(figsize=(11, 4.2))
    left, right = fig.subplots(1, 2)
    _plot_series(left, _series(group, "ranks", "image_size", "total_s"), prefix="ranks ")
    left.set(xlabel="image size (px)", ylabel="total time (s)", title="execution time")
    _plot_series(right, _series(group[group["ranks"] > 1], "ranks", "image_size", "efficiency_vs_1_rank"),
                 scale=100.0, prefix="ranks ")
    right.set(xlabel="image size (px)", ylabel="efficiency vs 1 rank (%)", title="T(1 rank) / T(n ranks)")
    return _finish(fig, f"Fig. 2: DDP-DS time and efficiency vs image size ({_describe(group, keys)})")


# --- Table 2 as a figure: precision scaling --------------------------------------------------------

def precision_scaling(data: Data, overlay: bool) -> Optional[Figure]:
    group, keys = _image_group(data, ["precision"], lambda g: g["precision"].nunique() >= 2,
                               lambda k, g: (k["strategy"] == "ddp-ds", k["pin_memory"] == "false",
                                             g["precision"].nunique(), _rank_counts(g), len(g)))
    if group is None:
        return None
    fig = Figure(figsize=(15, 4.2))
    time_ax, one_ax, fp64_ax = fig.subplots(1, 3)
    _plot_series(time_ax, _series(group, "precision", "ranks", "total_s"))
    time_ax.set(xlabel="ranks (GPUs)", ylabel="total time (s)", title="time")
    _plot_series(one_ax, _series(group, "precision", "ranks", "efficiency_vs_1_rank"), scale=100.0)
    one_ax.set(xlabel="ranks (GPUs)", ylabel="efficiency vs 1 rank (%)", title="T(1 rank) / T(n ranks)")
    _plot_series(fp64_ax, _series(group, "precision", "ranks", "efficiency_vs_fp64"), scale=100.0)
    fp64_ax.set(xlabel="ranks (GPUs)", ylabel="efficiency vs FP64 (%)", title="T(fp64) / T(precision)")
    if overlay:
        for precision, rows in paper.TABLE2.groupby("precision"):
            _paper_points(one_ax, rows["ranks"], rows["efficiency_vs_1_rank"] * 100, f"paper {precision}", precision)
            if precision != "fp64":
                _paper_points(fp64_ax, rows["ranks"], rows["efficiency_vs_fp64"] * 100, f"paper {precision}",
                              precision)
    for ax in (time_ax, one_ax, fp64_ax):
        ax.set_xticks(sorted(set(group["ranks"]) | (set(paper.TABLE2["ranks"]) if overlay else set())))
    suffix = f"; dashed: {paper.SOURCE}, Table 2" if overlay else ""
    return _finish(fig, f"Table 2: precision ({_describe(group, keys)}){suffix}")


# --- Table 3 as a figure: pin_memory ------------------------------------------------------------

def pin_memory_scaling(data: Data, overlay: bool) -> Optional[Figure]:
    group, keys = _image_group(data, ["pin_memory"], lambda g: g["pin_memory"].nunique() >= 2,
                               lambda k, g: (k["precision"] == "fp32", k["strategy"] == "ddp-ds", _rank_counts(g),
                                             len(g)))
    if group is None:
        return None
    fig = Figure(figsize=(11, 4.2))
    left, right = fig.subplots(1, 2)
    _plot_series(left, _series(group, "pin_memory", "ranks", "total_s"), prefix="pin_memory ")
    left.set(xlabel="ranks (GPUs)", ylabel="total time (s)", title="time")
    times = group.groupby(["ranks", "pin_memory"])["total_s"].mean().unstack()
    if {"true", "false"} <= set(times.columns):
        gain = (times["false"] / times["true"]).dropna()
        right.plot(gain.index.to_numpy(), gain.to_numpy() * 100, marker="o", label="measured")
    if overlay:
        rows = paper.TABLE3.dropna(subset=["efficiency_vs_pin_false"])
        _paper_points(right, rows["ranks"], rows["efficiency_vs_pin_false"] * 100, "paper Table 3")
    right.axhline(100, color="grey", linestyle=":")
    right.set(xlabel="ranks (GPUs)", ylabel="T(pin false) / T(pin true) (%)", title="pin_memory gain")
    return _finish(fig, f"Table 3: pin_memory ({_describe(group, keys)})")


# --- Fig. 3: the four profiler metrics in percent ------------------------------------------------

def _api_time(data: Data) -> pd.DataFrame:
    """Per run and rank: seconds in the kernel-launch and the host-wait calls (CUPTI API table; the
    columns LAUNCHES and HOST_WAITS, each summed over its APIs)."""
    api = data.cuda_api
    columns = ["file", "run_id", "rank", LAUNCHES, HOST_WAITS]
    if api.empty:
        return pd.DataFrame(columns=columns)
    kind = api["name"].map({**{n: LAUNCHES for n in LAUNCH_APIS}, **{n: HOST_WAITS for n in HOST_WAIT_APIS}})
    wide = api.assign(kind=kind).dropna(subset=["kind"]).pivot_table(
        index=["file", "run_id", "rank"], columns="kind", values="time_s", aggfunc="sum")
    wide = wide.reindex(pd.MultiIndex.from_frame(api[["file", "run_id", "rank"]].drop_duplicates()))
    return wide.reindex(columns=[LAUNCHES, HOST_WAITS]).fillna(0.0).reset_index()[columns]


def cuda_metrics(data: Data) -> pd.DataFrame:
    """Per run and rank, the seconds of the paper's Fig. 3 / 5 / 6 metrics (HtoD copies' device time,
    the host's time in kernel launches and in waits for the device, as `mgbench report --cuda` counts
    them: LAUNCH_APIS, HOST_WAIT_APIS; NCCL kernels' device time) and the profile window's length (s)."""
    summary = data.cuda_summary
    if summary.empty:
        return pd.DataFrame()
    frame = summary[["file", "run_id", "rank", "window_s", "htod_s", "nccl_kernel_s"]].merge(
        _api_time(data), on=["file", "run_id", "rank"], how="left").fillna(0.0)
    return frame.rename(columns={"htod_s": "CUDA memcpy HtoD", "nccl_kernel_s": "NCCL kernels"})


def _grouped_bars(ax, labels: Sequence[str], values: Dict[str, Sequence[float]]) -> None:
    x = np.arange(len(labels))
    width = 0.8 / max(1, len(values))
    for i, (name, heights) in enumerate(values.items()):
        ax.bar(x + (i - (len(values) - 1) / 2) * width, heights, width, label=name)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize="small")


def fig3_profiler_metrics(data: Data, overlay: bool) -> Optional[Figure]:
    metrics = cuda_metrics(data)
    image = data.completed(llm=False)
    if metrics.empty or image.empty:
        return None
    # Each rank's share of its own window, then the mean over ranks (as `report --cuda`'s shares).
    shares = metrics[["file", "run_id"]].assign(**{m: 100 * metrics[m] / metrics["window_s"] for m in FIG3_METRICS})
    per_run = shares.groupby(["file", "run_id"]).mean().reset_index()
    per_run = per_run.merge(image[["file", "run_id", "label"]], on=["file", "run_id"])
    if per_run.empty:
        return None
    fig = Figure(figsize=(max(8, 1.2 * len(per_run) + 3), 4.8))
    ax = fig.subplots()
    _grouped_bars(ax, list(per_run["label"]), {m: per_run[m].tolist() for m in FIG3_METRICS})
    ax.set(ylabel="% of the profile window (mean over ranks)")
    return _finish(fig, "Fig. 3: profiler metrics in percent of the profile window (CUPTI)")


# --- Fig. 4: LLM iteration times ------------------------------------------------------------------

def _llm_group(data: Data, ok: Callable[[pd.DataFrame], bool]) -> Optional[pd.DataFrame]:
    llm = data.completed(llm=True)
    llm = llm[llm["task"] == "llm"] if not llm.empty else llm
    if llm.empty:
        return None
    # Datasets side by side (their sample counts differ), as the paper's Fig. 4.
    return _choose(llm, _workload_keys(llm, ["dataset", "train_samples"]), ok,
                   lambda k, g: (k["recipe"] == "lora", g["dataset"].nunique(), len(g)))


def fig4_llm_iteration_times(data: Data, overlay: bool) -> Optional[Figure]:
    group = _llm_group(data, lambda g: g["s_per_it"].notna().any())
    if group is None:
        return None
    means = group.groupby(["dataset", "ranks"])["s_per_it"].mean().unstack()
    fig = Figure(figsize=(10, 4.5))
    ax = fig.subplots()
    _grouped_bars(ax, list(means.index), {f"ranks {r}": means[r].tolist() for r in means.columns})
    ax.set(xlabel="dataset", ylabel="iteration time (s/it)")
    if overlay and "alpaca" in means.index:
        twin = ax.twinx()
        x = list(means.index).index("alpaca")
        rows = paper.TABLE5[paper.TABLE5["pin_memory"] == "false"]
        twin.plot(x - 0.3 + 0.2 * (rows["ranks"] - 1), rows["s_per_it"], linestyle="none", marker="s",
                  fillstyle="none", color="black", label="paper Table 5 (alpaca, 1-4 GPUs, left to right)")
        twin.set_ylim(0, None)
        twin.set_ylabel("paper s/it (Llama3-8B LoRA)")
        twin.legend(loc="upper right", fontsize="small")
        ax.legend(loc="upper left", fontsize="small")
    return _finish(fig, f"Fig. 4: LLM iteration time per dataset and rank count "
                        f"({_describe(group, [k for k in LLM_WORKLOAD if k in group])})")


# --- Fig. 5 and 6: CUDA API calls of LLM runs ------------------------------------------------------

def _llm_cuda(data: Data) -> pd.DataFrame:
    metrics = cuda_metrics(data)
    llm = data.completed(llm=True)
    if metrics.empty or llm.empty:
        return pd.DataFrame()
    return metrics.merge(llm[["file", "run_id", "dataset", "ranks", "pin_memory", "label"]], on=["file", "run_id"])


def fig5_cuda_api_by_dataset(data: Data, overlay: bool) -> Optional[Figure]:
    frame = _llm_cuda(data)
    if frame.empty:
        return None
    # The paper profiles one GPU; with no 1-rank run, the mean over ranks of the others.
    if (frame["ranks"] == 1).any():
        frame = frame[frame["ranks"] == 1]
    names = [LAUNCHES, HOST_WAITS, "CUDA memcpy HtoD"]
    means = frame.groupby("dataset")[names].mean()
    fig = Figure(figsize=(9, 4.5))
    ax = fig.subplots()
    _grouped_bars(ax, list(means.index), {n: means[n].tolist() for n in names})
    ax.set(xlabel="dataset", ylabel="time in the profile window (s)")
    return _finish(fig, "Fig. 5: CUDA API calls per dataset (LLM runs, CUPTI)")


def fig6_cuda_api_pin_memory(data: Data, overlay: bool) -> Optional[Figure]:
    frame = _llm_cuda(data)
    if frame.empty or frame["pin_memory"].nunique() < 2:
        return None
    names = [LAUNCHES, "CUDA memcpy HtoD", "NCCL kernels"]
    # Summed over ranks, as the paper sums its accelerators (its totals may exceed the window).
    per_run = frame.groupby(["file", "run_id", "ranks", "pin_memory"])[names + ["window_s"]].sum().reset_index()
    groups = per_run.groupby(["ranks", "pin_memory"])[names + ["window_s"]].mean()
    labels = [f"{r} rank(s), pin {p}" for r, p in groups.index]
    fig = Figure(figsize=(12, 4.5))
    left, right = fig.subplots(1, 2)
    _grouped_bars(left, labels, {n: groups[n].tolist() for n in names})
    left.set(ylabel="time, summed over ranks (s)")
    _grouped_bars(right, labels, {n: (100 * groups[n] / groups["window_s"]).tolist() for n in names})
    right.set(ylabel="% of the profile windows")
    return _finish(fig, "Fig. 6: CUDA API calls with and without pin_memory (LLM runs, CUPTI)")


# --- What the paper lacks ------------------------------------------------------------------------

_MAX_RUNS = 12


def loss_accuracy_per_epoch(data: Data, overlay: bool) -> Optional[Figure]:
    ep = data.epochs
    if ep.empty or data.runs.empty:
        return None
    per_epoch = ep.groupby(["file", "run_id", "epoch"]).agg(loss=("loss_mean", "mean"),
                                                             accuracy=("test_accuracy", "first")).reset_index()
    per_epoch = per_epoch.merge(data.runs[["file", "run_id", "label"]], on=["file", "run_id"])
    if per_epoch.empty:
        return None
    fig = Figure(figsize=(11, 4.2))
    left, right = fig.subplots(1, 2)
    for label, rows in per_epoch.groupby("label", sort=False):
        left.plot(rows["epoch"] + 1, rows["loss"], marker="o", label=label)
        accuracy = rows.dropna(subset=["accuracy"])
        if not accuracy.empty:
            right.plot(accuracy["epoch"] + 1, accuracy["accuracy"] * 100, marker="o", label=label)
    left.set(xlabel="epoch", ylabel="training loss (mean over steps and ranks)")
    right.set(xlabel="epoch", ylabel="test accuracy (%)")
    return _finish(fig, "Loss and test accuracy per epoch")


def step_timeline(data: Data, overlay: bool) -> Optional[Figure]:
    st = data.steps
    if st.empty:
        return None
    # Runs with step rows (not comm or prediction runs), the latest multi-rank ones first.
    with_steps = st[["file", "run_id"]].drop_duplicates()
    runs = data.runs.merge(with_steps, on=["file", "run_id"])
    if runs.empty:
        return None
    runs["multi"] = runs["ranks"] > 1
    chosen = runs.sort_values(["multi", "run_id"], ascending=False).head(6)
    fig = Figure(figsize=(11, 2.8 * len(chosen)))
    axes = np.atleast_1d(fig.subplots(len(chosen), 1, squeeze=False)[:, 0])
    for ax, (_, run) in zip(axes, chosen.iterrows()):
        rows = st[(st["file"] == run["file"]) & (st["run_id"] == run["run_id"])]
        for rank, r in rows.groupby("rank"):
            # One line per rank, broken (a NaN point) where an epoch begins: no steps run in the evaluation
            # before it, and a line across that gap would draw steps that never happened.
            breaks = np.flatnonzero(r["epoch"].ne(r["epoch"].shift()).to_numpy()[1:]) + 1
            # Small markers: an epoch of one step (a segment of one point) still shows.
            ax.plot(np.insert(r["start_s"].to_numpy(float), breaks, np.nan),
                    np.insert(r["step_s"].to_numpy(float), breaks, np.nan), linewidth=0.8, marker=".",
                    markersize=2, label=f"rank {rank}")
        ax.set(xlabel="time since the start of training (s)", ylabel="step time (s)", title=run["label"])
    return _finish(fig, "Step time per rank (stragglers stand out)")


def phase_breakdown(data: Data, overlay: bool) -> Optional[Figure]:
    ep = data.epochs
    if ep.empty:
        return None
    fields = [f for _, f in PHASES]
    # Per run: each phase summed over epochs and divided by the rank's optimizer steps, then the mean
    # over ranks, in ms; "other" is the rest of train_s. Per step, not per run: a 10-epoch run and a
    # 1-epoch one share the axis (in seconds the short runs' bars were slivers beside the long one's).
    per_rank = ep.groupby(["file", "run_id", "rank"])[fields + ["train_s"]].sum()
    if data.steps.empty:
        return None
    # The step rows of epochs that have their record: a stopped run's unfinished epoch has steps but
    # no epoch row (its phases are in no epoch sum), and a continuation's placeholders are no rows.
    keys = ["file", "run_id", "rank", "epoch"]
    steps = data.steps.merge(ep[keys].drop_duplicates(), on=keys).groupby(["file", "run_id", "rank"]).size()
    per_rank = per_rank.join(steps.rename("steps"), how="inner")
    per_rank = per_rank[per_rank["steps"] > 0]
    per_rank[fields + ["train_s"]] = per_rank[fields + ["train_s"]].div(per_rank["steps"], axis=0) * 1e3
    per_run = per_rank.groupby(["file", "run_id"]).mean().reset_index()
    per_run = per_run.merge(data.runs[["file", "run_id", "label"]], on=["file", "run_id"]).tail(30)
    if per_run.empty:
        return None
    per_run["other_s"] = (per_run["train_s"] - per_run[fields].sum(axis=1)).clip(lower=0)
    fig = Figure(figsize=(11, 2.0 + 0.35 * len(per_run)))  # 0.5 in of it for the legend's two rows
    ax = fig.subplots()
    left = np.zeros(len(per_run))
    for name, f in list(PHASES) + [("other", "other_s")]:
        ax.barh(per_run["label"], per_run[f], left=left, label=name)
        left += per_run[f].to_numpy()
    ax.set(xlabel="time per optimizer step, mean over ranks (ms)")
    ax.invert_yaxis()
    # Above the axes, not inside: the bars of runs of similar length leave no corner free, and the
    # default place ("best") covered some. tight_layout (in _finish) makes room for it in the figure.
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=5, fontsize="small")
    return _finish(fig, "Where a training step's time goes: phases per run")


def llm_recipes(data: Data, overlay: bool) -> Optional[Figure]:
    llm = data.completed(llm=True)
    if llm.empty or data.steps.empty:
        return None
    llm = llm[llm["task"] == "llm"]
    if llm.empty:
        return None
    fig = Figure(figsize=(15, 4.2))
    loss_ax, tok_ax, mem_ax = fig.subplots(1, 3)
    st = data.steps.merge(llm[["file", "run_id", "label"]], on=["file", "run_id"])
    for label, rows in st.groupby("label", sort=False):
        # Optimizer steps counted across epochs; the loss is the mean over ranks.
        per_step = rows.groupby(["epoch", "step"])["loss"].mean().reset_index()
        loss_ax.plot(np.arange(1, len(per_step) + 1), per_step["loss"], label=label)
    loss_ax.set(xlabel="optimizer step", ylabel="training loss (mean over ranks)")
    by_recipe = llm.groupby("recipe")[["tokens_per_s", "peak_memory_mib"]].mean()
    tok_ax.bar(by_recipe.index, by_recipe["tokens_per_s"], label="tokens/s")
    tok_ax.set(xlabel="recipe", ylabel="tokens/s (all ranks, mean over runs)")
    mem_ax.bar(by_recipe.index, by_recipe["peak_memory_mib"], label="peak memory")
    mem_ax.set(xlabel="recipe", ylabel="peak memory, rank 0 (MiB)")
    return _finish(fig, "LLM recipes: loss, throughput and peak memory")


def comm_bandwidth(data: Data, overlay: bool) -> Optional[Figure]:
    rows = data.comm
    if rows.empty:
        return None
    rows = rows[rows["in_place"] == 0]
    # Per run, collective and size: the time averaged over ranks, algbw from it, busbw with the
    # run's bus factor (busbw / algbw of its rows), as `mgbench report` and nccl-tests compute them.
    per = rows.groupby(["file", "run_id", "collective", "dtype", "bytes"]).agg(
        time_s=("time_s", "mean"), factor=("busbw_gbs", "first"), algbw=("algbw_gbs", "first")).reset_index()
    per["busbw_gbs"] = per["bytes"] / per["time_s"] / 1e9 * (per["factor"] / per["algbw"])
    per = per.merge(data.runs[["file", "run_id", "backend", "ranks"]], on=["file", "run_id"])
    fig = Figure(figsize=(12, 4.5))
    time_ax, bw_ax = fig.subplots(1, 2)
    several = per[["file", "run_id"]].drop_duplicates().shape[0] > 1
    for (file, run_id, collective, dtype, backend, ranks), group in per.groupby(
            ["file", "run_id", "collective", "dtype", "backend", "ranks"]):
        group = group.sort_values("bytes")
        label = f"{collective} {dtype} {backend} {ranks}r" + (f" ({run_id})" if several else "")
        time_ax.plot(group["bytes"], group["time_s"] * 1e6, marker=".", label=label)
        bw_ax.plot(group["bytes"], group["busbw_gbs"], marker=".", label=label)
    time_ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="time of one collective (us)")
    bw_ax.set(xscale="log", xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)")
    return _finish(fig, "mgbench comm: collectives by message size (out of place; time averaged over ranks)")


FIGURES: List[FigureSpec] = [
    FigureSpec("fig1_strategy_scaling", "Fig. 1: strategy scaling",
               "completed image runs of one workload at two or more rank counts (e.g. ddp, ddp-rr, ddp-ds at 1 and "
               "2 ranks)", fig1_strategy_scaling),
    FigureSpec("fig2_time_efficiency_vs_size", "Fig. 2: time and efficiency vs image size",
               "completed ddp-ds image runs at two or more image sizes and two or more rank counts",
               fig2_time_efficiency_vs_size),
    FigureSpec("table2_precision_scaling", "Table 2: precision", "completed image runs of one workload in two or "
               "more precisions (fp64, fp32, fp16, ...)", precision_scaling),
    FigureSpec("table3_pin_memory_scaling", "Table 3: pin_memory", "completed image runs of one workload with "
               "--pin-memory true and false", pin_memory_scaling),
    FigureSpec("fig3_profiler_metrics", "Fig. 3: profiler metrics",
               "image runs on GPUs with CUDA metrics (--cupti true, the default on GPUs)", fig3_profiler_metrics),
    FigureSpec("fig4_llm_iteration_times", "Fig. 4: LLM iteration times", "completed `mgbench llm` runs",
               fig4_llm_iteration_times),
    FigureSpec("fig5_cuda_api_by_dataset", "Fig. 5: CUDA API calls per dataset",
               "`mgbench llm` runs on GPUs with CUDA metrics (--cupti true)", fig5_cuda_api_by_dataset),
    FigureSpec("fig6_cuda_api_pin_memory", "Fig. 6: CUDA API calls and pin_memory",
               "`mgbench llm` runs on GPUs with CUDA metrics, with --pin-memory true and false",
               fig6_cuda_api_pin_memory),
    FigureSpec("loss_accuracy_per_epoch", "Loss and test accuracy per epoch", "runs with a completed epoch",
               loss_accuracy_per_epoch),
    FigureSpec("step_timeline", "Step time per rank", "runs with written steps", step_timeline),
    FigureSpec("phase_breakdown", "Training time by phase", "runs with a completed epoch", phase_breakdown),
    FigureSpec("llm_recipes", "LLM recipes", "completed `mgbench llm` runs (lora, qlora, dpo, qat, ...)",
               llm_recipes),
    FigureSpec("comm_bandwidth", "Collectives by message size", "`mgbench comm` runs", comm_bandwidth),
]


def by_name(name: str) -> FigureSpec:
    """The figure of that name; raises KeyError listing the names."""
    for spec in FIGURES:
        if spec.name == name:
            return spec
    raise KeyError(f"no figure '{name}'; figures: {', '.join(s.name for s in FIGURES)}")


def draw(name: str, source, overlay: bool = False) -> Optional[Figure]:
    """One figure drawn from runs, files or patterns; None when the data do not support it."""
    data = source if isinstance(source, Data) else Data(as_runs(source))
    return by_name(name).draw(data, overlay)
