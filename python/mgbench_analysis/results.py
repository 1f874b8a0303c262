"""Reading mgbench results files (docs/results-schema.md) into pandas frames.

Only the documented schema is read, with h5py; nothing here imports mgbench's C++ code. Every frame
carries the columns ``file`` and ``run_id`` (a run is identified by both: two files may hold runs of
the same id), and the per-rank frames a ``rank`` column.
"""
from __future__ import annotations

import glob
import os
import stat
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Sequence, Union

import h5py
import numpy as np
import pandas as pd

SCHEMA_NAME = "mgbench-results"
#: Versions this package reads (docs/results-schema.md, "Version history"); fields a version lacks
#: read as the writer's defaults.
SUPPORTED_SCHEMA_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#: The training phases of a step, in the order `mgbench report --phases` prints them: (name, field).
PHASES = (("data", "data_s"), ("h2d", "h2d_s"), ("buffer_broadcast", "buffer_broadcast_s"), ("transform", "transform_s"),
          ("forward", "forward_s"), ("backward", "backward_s"), ("allreduce", "allreduce_s"),
          ("loss_reduce", "loss_reduce_s"), ("optimizer", "optimizer_s"))

# Fields of cuda_summary that runs before schema 12 (steps, kernel_busy_s) and 13 (between_steps_*)
# lack, with the writer's defaults.
_CUDA_SUMMARY_DEFAULTS = {"steps": -1, "kernel_busy_s": np.nan, "between_steps_s": np.nan,
                          "between_steps_api_calls": -1, "between_steps_kernel_count": -1,
                          "between_steps_kernel_s": np.nan, "between_steps_copy_count": -1,
                          "between_steps_copy_bytes": -1}

# Fields of the summary record, with the values of a run that has not written it (the writer's fill values).
_SUMMARY_DEFAULTS = {"total_s": np.nan, "train_s": np.nan, "eval_s": np.nan, "samples_per_s": np.nan,
                     "final_loss": np.nan, "test_accuracy": np.nan, "epochs_completed": 0,
                     "finished_unix_s": np.nan, "s_per_it": np.nan, "tokens_per_s": np.nan, "mfu": np.nan,
                     "eval_loss": np.nan, "peak_memory_bytes": -1, "padded_tokens_per_s": np.nan,
                     "nccl_transports": "", "ops_per_step": -1, "checkpoint_s": np.nan}

# Fields of the steps and epochs tables that earlier versions lack, with the writer's defaults
# (results/schema.h's StepRecord, EpochRecord; the phases are PHASES, 0).
_STEP_DEFAULTS = {"batch_index": -1, "allreduce_window_s": np.nan, "loss_scale": np.nan, "skipped": 0, "tokens": 0,
                  "padded_tokens": 0, "lr": np.nan, "allgather_s": 0.0, "reducescatter_s": 0.0, "page_faults": -1,
                  "cuda_graph": -1}
_EPOCH_DEFAULTS = {"loaded_samples": 0, "eval_s": np.nan, "test_correct": -1, "test_samples": -1,
                   "test_accuracy": np.nan, "allreduce_window_s": 0.0, "skipped_steps": 0, "eval_loss": np.nan,
                   "allgather_s": 0.0, "reducescatter_s": 0.0, "skipped_images": 0}

PathsOrGlobs = Union[str, os.PathLike, Iterable[Union[str, os.PathLike]]]


class ResultsError(Exception):
    """A file that cannot be read as an mgbench results file; the message names the file."""


def expand(paths_or_globs: PathsOrGlobs) -> List[str]:
    """The results files named by files, directories (every ``*.h5`` below) and quoted glob patterns,
    sorted, each file once however it was named, as ``mgbench report`` expands its arguments.

    Raises ResultsError for a pattern that matches nothing, a directory without results files, a
    path that does not exist, or nothing given at all.
    """
    if isinstance(paths_or_globs, (str, os.PathLike)):
        paths_or_globs = [paths_or_globs]
    files: List[str] = []
    for item in map(os.fspath, paths_or_globs):
        if not os.path.exists(item) and any(c in item for c in "*?["):
            matches = sorted(glob.glob(item))
            if not matches:
                raise ResultsError(f"no file matches '{item}'")
            files.extend(matches)
        elif os.path.isdir(item):
            found = sorted(os.path.join(d, f) for d, _, names in os.walk(item) for f in names if f.endswith(".h5"))
            if not found:
                raise ResultsError(f"no results file (*.h5) below '{item}'")
            files.extend(found)
        elif not os.path.exists(item):
            raise ResultsError(f"results file '{item}' does not exist")
        else:
            files.append(item)
    if not files:
        raise ResultsError("no results file given")
    # Each file once however it was named (a directory and a file in it, ./a.h5 and a.h5): its runs
    # read twice were two repeats of one run.
    unique: Dict[str, str] = {}
    for f in sorted(files):
        unique.setdefault(os.path.realpath(f), f)
    return list(unique.values())


def _text(value) -> str:
    if isinstance(value, (bytes, np.bytes_)):
        return value.split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value)


def _attribute(value):
    """An HDF5 attribute as a plain Python value: str, int, float (arrays of one element unwrapped)."""
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(-1)[0]
    if isinstance(value, (bytes, np.bytes_, str)):
        return _text(value)
    if isinstance(value, (np.integer, int)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return float(value)
    return value


def _table(group: h5py.Group, name: str) -> pd.DataFrame:
    """A compound dataset as a frame (fixed-length strings decoded); empty when absent."""
    if name not in group:
        return pd.DataFrame()
    data = group[name][()]
    frame = pd.DataFrame({column: data[column] for column in data.dtype.names})
    for column in frame.columns:
        if frame[column].dtype == object or data.dtype[column].kind == "S":
            frame[column] = [_text(v) for v in frame[column]]
    return frame


@dataclass
class Run:
    """One run of a results file, as read: its attributes, state, summary and per-rank tables."""

    file: str
    run_id: str
    attributes: Dict[str, object]
    status: str
    error: str
    summary: Dict[str, float]
    steps: List[pd.DataFrame] = field(default_factory=list)  # [rank], written rows only, metrics joined
    epochs: List[pd.DataFrame] = field(default_factory=list)  # [rank], written rows only
    cuda_summary: List[pd.DataFrame] = field(default_factory=list)  # [rank] of GPU runs with CUPTI
    cuda_api: List[pd.DataFrame] = field(default_factory=list)  # [rank], used rows only
    cuda_kernels: List[pd.DataFrame] = field(default_factory=list)  # [rank], used rows only
    comm: List[pd.DataFrame] = field(default_factory=list)  # [rank] rows of `mgbench comm` runs, written rows only
    energy: List[pd.DataFrame] = field(default_factory=list)  # [rank] one row, runs with --telemetry (schema 9)
    telemetry: List[pd.DataFrame] = field(default_factory=list)  # [rank] the readings written
    metric_names: List[str] = field(default_factory=list)  # the recipe's per-step metrics (steps columns)
    rank_attributes: List[Dict[str, object]] = field(default_factory=list)  # [rank]: hostname, gpu_pci_bus_id, ...

    @property
    def world_size(self) -> int:
        return int(self.attributes.get("world_size", len(self.steps) or 1))


def _check_schema(f: h5py.File, path: str) -> None:
    schema = _attribute(f.attrs["schema"]) if "schema" in f.attrs else None
    if schema != SCHEMA_NAME or "runs" not in f:
        raise ResultsError(f"'{path}' is not an mgbench results file (root attribute schema = "
                           f"{schema!r}, expected '{SCHEMA_NAME}' and a /runs group)")
    version = _attribute(f.attrs.get("schema_version", -1))
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        raise ResultsError(f"'{path}' has results schema version {version}; this mgbench_analysis reads versions "
                           f"{', '.join(map(str, SUPPORTED_SCHEMA_VERSIONS))} (docs/results-schema.md): "
                           "use the mgbench_analysis of the mgbench that wrote it")


def being_written(path: str) -> bool:
    """Whether another process holds the write lock of a results file ("<path>.lock", fcntl, held by
    the writing job's rank 0 for its whole run): F_GETLK, which takes no lock itself."""
    import fcntl
    import struct
    try:
        fd = os.open(path + ".lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        layout = "hhqqi4x"  # struct flock (Linux, 64-bit): type, whence, start, len, pid
        probe = struct.pack(layout, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        return struct.unpack(layout, fcntl.fcntl(fd, fcntl.F_GETLK, probe))[0] != fcntl.F_UNLCK
    except OSError:
        return False
    finally:
        os.close(fd)


#: A run stored "running" whose file no job holds: the job ended without closing it (killed, or its node or
#: link lost). Shown as such, as `mgbench report` does.
ABORTED = "aborted"
ABORTED_ERROR = ("the job ended without closing the run (its ranks killed, or a node or link lost): nothing "
                 "recorded why")


def _read_run(path: str, run_id: str, group: h5py.Group) -> Run:
    attributes = {name: _attribute(value) for name, value in group.attrs.items()}
    version = attributes.get("schema_version")
    if version is not None and version not in SUPPORTED_SCHEMA_VERSIONS:
        raise ResultsError(f"'{path}' /runs/{run_id} was written with results schema version {version}; this "
                           f"mgbench_analysis reads versions {', '.join(map(str, SUPPORTED_SCHEMA_VERSIONS))}")
    status = _text(group["status"][0]) if "status" in group else ""
    error = _text(group["error"][0]) if "error" in group else ""
    if status == "running" and not being_written(path):
        status, error = ABORTED, error or ABORTED_ERROR
    summary = dict(_SUMMARY_DEFAULTS)
    if "summary" in group and len(group["summary"]):
        row = group["summary"][0]
        summary.update({name: _text(row[name]) if row.dtype[name].kind == "S" else row[name].item()
                        for name in row.dtype.names})
    run = Run(path, run_id, attributes, status, error, summary)
    for rank in range(1 << 20):
        name = f"rank_{rank}"
        if name not in group:
            break
        rank_group = group[name]
        run.rank_attributes.append({key: _attribute(value) for key, value in rank_group.attrs.items()})
        steps = _table(rank_group, "steps")
        if "metrics" in rank_group:
            metrics = rank_group["metrics"]
            if not run.metric_names:
                run.metric_names = [c for c in _text(metrics.attrs.get("columns", b"")).split(",") if c]
            values = metrics[()]
            for k, column in enumerate(run.metric_names):
                steps[column] = values[: len(steps), k] if len(steps) else []
        if "epoch" in steps:
            steps = steps[steps["epoch"] >= 0].reset_index(drop=True)
        epochs = _table(rank_group, "epochs")
        if "epoch" in epochs:
            epochs = epochs[epochs["epoch"] >= 0].reset_index(drop=True)
        for table, defaults in ((steps, _STEP_DEFAULTS), (epochs, _EPOCH_DEFAULTS)):
            if "epoch" in table:  # phases a version lacked (schema 6's) were not timed apart: 0
                for column, default in [*((phase, 0.0) for _, phase in PHASES), *defaults.items()]:
                    if column not in table:
                        table[column] = default
        run.steps.append(steps)
        run.epochs.append(epochs)
        if "comm" in rank_group:
            comm = _table(rank_group, "comm")
            run.comm.append(comm[comm["bytes"] >= 0].reset_index(drop=True))
        if "energy" in rank_group:
            readings = _table(rank_group, "telemetry")
            run.energy.append(_table(rank_group, "energy"))
            run.telemetry.append(readings[readings["t_s"].notna()].reset_index(drop=True))
        if "cuda_summary" in rank_group:
            summary = _table(rank_group, "cuda_summary")
            for column, default in _CUDA_SUMMARY_DEFAULTS.items():
                if column not in summary:
                    summary[column] = default
            run.cuda_summary.append(summary)
            api = _table(rank_group, "cuda_api")
            kernels = _table(rank_group, "cuda_kernels")
            run.cuda_api.append(api[api["name"] != ""].reset_index(drop=True) if "name" in api else api)
            run.cuda_kernels.append(kernels[kernels["name"] != ""].reset_index(drop=True) if "name" in kernels
                                    else kernels)
    return run


def read_file(path: Union[str, os.PathLike]) -> List[Run]:
    """Every run of one results file, in name order (as ``mgbench report``).

    Raises ResultsError naming the file when it is missing, not a regular file (a FIFO would block
    the reader forever, as ``mgbench report`` refuses it too), not HDF5, of another schema, or of a
    schema version this package does not read.
    """
    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise ResultsError(f"results file '{path}' does not exist or is not readable") from None
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "not a file"
        raise ResultsError(f"results file '{path}' is not a regular file ({kind}): expected an HDF5 file mgbench wrote")
    if not os.access(path, os.R_OK):
        raise ResultsError(f"results file '{path}' does not exist or is not readable")
    if not h5py.is_hdf5(path):
        raise ResultsError(f"'{path}' is not an HDF5 file")
    try:
        # locking=False: a file may be read while its job still writes it (docs/results-schema.md).
        with h5py.File(path, "r", locking=False) as f:
            _check_schema(f, path)
            return [_read_run(path, run_id, group) for run_id, group in f["runs"].items()]
    except (OSError, KeyError, ValueError) as e:
        raise ResultsError(f"'{path}': cannot be read as an mgbench results file: {e}") from e


def read(paths_or_globs: PathsOrGlobs) -> List[Run]:
    """The runs of every file :func:`expand` finds, files in sorted order."""
    return [run for path in expand(paths_or_globs) for run in read_file(path)]


def _per_rank(runs: Sequence[Run], tables) -> pd.DataFrame:
    frames = []
    for run in runs:
        for rank, table in enumerate(tables(run)):
            if table.empty:
                continue
            frame = table.copy()
            frame.insert(0, "rank", rank)
            frame.insert(0, "run_id", run.run_id)
            frame.insert(0, "file", run.file)
            frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["file", "run_id", "rank"])
    return pd.concat(frames, ignore_index=True)


def energy(source, table: str = "energy") -> pd.DataFrame:
    """The energy of runs recorded with ``--telemetry`` (schema 9): one row per rank (``energy``: source,
    node_share, span_s, energy_j, samples, tokens, power, clocks, temperature, throttled_s) or per rank
    and reading (``telemetry``), columns file, run_id, rank first. A run's energy is the sum over its
    ranks of energy_j x node_share (a node's RAPL counter is shared by its ranks); J/sample divides it
    by the samples summed over the ranks, as ``mgbench report --energy`` does.

    Raises ValueError for another table name.
    """
    tables = {"energy": lambda run: run.energy, "telemetry": lambda run: run.telemetry}
    if table not in tables:
        raise ValueError(f"energy(table={table!r}): expected one of {', '.join(tables)}")
    return _per_rank(as_runs(source), tables[table])


def as_runs(source) -> List[Run]:
    """Runs already read (a list of Run; an empty one: no runs, as a file may hold), or the runs of
    files, directories and patterns."""
    if isinstance(source, (list, tuple)) and all(isinstance(r, Run) for r in source):
        return list(source)
    return read(source)


def steps(source) -> pd.DataFrame:
    """Every written step row of every rank (``rank_<r>/steps``, the recipe's metrics as extra columns):
    columns file, run_id, rank, then the schema's fields (seconds, samples, tokens, ...)."""
    return _per_rank(as_runs(source), lambda run: run.steps)


def epochs(source) -> pd.DataFrame:
    """Every written epoch row of every rank (``rank_<r>/epochs``): columns file, run_id, rank, then the
    schema's fields."""
    return _per_rank(as_runs(source), lambda run: run.epochs)


def comm(source) -> pd.DataFrame:
    """The rows of `mgbench comm` runs (``rank_<r>/comm``), one per rank, collective, size and placement:
    columns file, run_id, rank, then the schema's fields (bytes, time_s, algbw_gbs, busbw_gbs, wrong, ...)."""
    return _per_rank(as_runs(source), lambda run: run.comm)


def cuda(source, table: str = "summary") -> pd.DataFrame:
    """The CUPTI tables of GPU runs, one row per rank (``summary``) or per rank and API call (``api``) or
    kernel (``kernels``): columns file, run_id, rank, then the schema's fields. Empty for CPU runs.

    Raises ValueError for another table name.
    """
    tables = {"summary": lambda run: run.cuda_summary, "api": lambda run: run.cuda_api,
              "kernels": lambda run: run.cuda_kernels}
    if table not in tables:
        raise ValueError(f"cuda(table={table!r}): expected one of {', '.join(tables)}")
    return _per_rank(as_runs(source), tables[table])
