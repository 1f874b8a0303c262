"""The Python analysis package (python/mgbench_analysis) and `mgbench-plot` on files of real runs.

A module fixture runs a small experiment matrix with the real binary (image: 1 and 2 ranks, two
strategies, fp64 and fp32, two image sizes, pin_memory true; LLM: LoRA on two datasets at 1 and 2
ranks, DPO; an image run preempted with SIGUSR1 and resumed). The oracles are `mgbench report --csv`
(the frames' values), h5py reads of the files (the per-rank frames), and the frames themselves (the
figures' data, read back from the matplotlib artists). No GPU here: the CUDA figures (Figs. 3, 5, 6)
are drawn from a copy of the files to which schema-conforming CUPTI tables were added with h5py.
"""
import math
import os
import re
import shutil
import subprocess
import sys
import threading
from io import StringIO
from pathlib import Path

import numpy as np
import pytest

from conftest import ENV, SHARED, mgbench, not_here, preempt

h5py = pytest.importorskip("h5py")
pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import mgbench_analysis as mga  # noqa: E402
from mgbench_analysis import figures as figs  # noqa: E402
from mgbench_analysis.cli import plot_all  # noqa: E402

PY_ENV = dict(ENV, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "python"))
MNIST = SHARED / "mnist"
MODEL = Path(os.environ.get("MGBENCH_ORACLE_DIR", "")) / "llama_tiny_2256"
TOKENIZER = SHARED / "llama3" / "tiktoken_small.model"
IMAGE = ["image", "--data", MNIST, "--width-mult", "0.25", "--threads", "1", "--progress-interval", "1000",
         "--device", "cpu", "--limit-train", "256", "--limit-test", "128", "--batch-size", "32", "--epochs", "2"]
LLM = ["llm", "--model", MODEL, "--tokenizer", TOKENIZER, "--limit", "32", "--batch-size", "2", "--max-steps", "3",
       "--warmup-steps", "1", "--lora-rank", "4", "--precision", "fp32", "--progress-interval", "1000", "--device",
       "cpu"]
ALPACA = ["--dataset", "alpaca", "--data", SHARED / "text" / "alpaca" / "alpaca_cleaned_first5k.json"]
SAMSUM = ["--dataset", "samsum", "--data", SHARED / "text" / "samsum" / "samsum_test_819.json"]
DPO = ["llm", "--recipe", "dpo", "--model", MODEL, "--tokenizer", TOKENIZER, "--dataset", "stack_exchange_paired",
       "--data", SHARED / "text" / "dpo" / "stack_exchange_paired_tiny_torchtune.json", "--limit", "16",
       "--batch-size", "2", "--grad-accum", "1", "--max-steps", "3", "--lora-rank", "4", "--precision", "fp32",
       "--progress-interval", "1000", "--device", "cpu"]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """A results directory of real runs: image.h5, llm.h5, comm.h5, resumed.h5."""
    if not (MNIST / "train-images-idx3-ubyte.gz").exists() or not MODEL.exists():
        pytest.skip(f"needs MNIST at {MNIST} and the tiny Llama oracle at {MODEL}")
    d = tmp_path_factory.mktemp("matrix")
    image = d / "image.h5"
    for np_, strategy, precision, size, pin in [(1, "ddp-ds", "fp32", 32, "false"), (2, "ddp-ds", "fp32", 32, "false"),
                                                (2, "ddp", "fp32", 32, "false"), (1, "ddp-ds", "fp64", 32, "false"),
                                                (2, "ddp-ds", "fp64", 32, "false"), (1, "ddp-ds", "fp64", 48, "false"),
                                                (2, "ddp-ds", "fp64", 48, "false"), (1, "ddp-ds", "fp32", 32, "true")]:
        mgbench(*IMAGE, "--strategy", strategy, "--precision", precision, "--image-size", size, "--pin-memory", pin,
                "--results", image, np=np_, check=True)
    llm = d / "llm.h5"
    for np_, dataset, pin in [(1, ALPACA, "false"), (2, ALPACA, "false"), (1, SAMSUM, "false"), (1, ALPACA, "true")]:
        mgbench(*LLM, *dataset, "--pin-memory", pin, "--results", llm, np=np_, check=True)
    mgbench(*DPO, "--results", llm, np=1, check=True)
    # 3 ranks: bus factors other than 1 (all-reduce 4/3, all-gather 2/3).
    mgbench("comm", "--collective", "all-reduce,all-gather", "--min-bytes", "64", "--max-bytes", "64K",
            "--step-factor", "8", "--iters", "3", "--results", d / "comm.h5", np=3, check=True)
    # Preempted with SIGUSR1 after its checkpoint at step 3 (of 8 per rank), then resumed to the end.
    resumed, ck = d / "resumed.h5", d / "ck"
    args = [*IMAGE, "--image-size", "32", "--checkpoint-dir", ck, "--results", resumed]
    preempt([*args, "--checkpoint-every", "3"], ck, 3)
    mgbench(*args, "--resume", np=2, check=True)
    return d


def add_cuda_tables(path, step_fields=False):
    """Adds CUPTI tables of the documented layout (docs/results-schema.md) to every run of a copied
    results file, with values drawn from a seeded generator: the CUDA figures' input without a GPU.
    step_fields: with schema 12's `steps` and `kernel_busy_s`, schema 13's `between_steps_*` and the names
    in UTF-8, as mgbench writes them (without: schema 11's layout, the names and the run's status as h5py writes bytes by default,
    ASCII, which `mgbench report` reads too)."""
    rng = np.random.default_rng(7)
    summary_type = np.dtype([(n, "<f8") for n in ("window_start_s", "window_s")] +
                            [("htod_count", "<i8"), ("htod_bytes", "<i8"), ("htod_s", "<f8"),
                             ("htod_pinned_count", "<i8"), ("dtoh_count", "<i8"), ("dtoh_bytes", "<i8"),
                             ("dtoh_s", "<f8"), ("dtod_count", "<i8"), ("dtod_bytes", "<i8"), ("dtod_s", "<f8"),
                             ("kernel_count", "<i8"), ("kernel_s", "<f8"), ("nccl_kernel_count", "<i8"),
                             ("nccl_kernel_s", "<f8"), ("samples", "<i8"), ("peak_allocated_bytes", "<i8"),
                             ("peak_reserved_bytes", "<i8"), ("dropped_records", "<i8")] +
                            ([("steps", "<i8"), ("kernel_busy_s", "<f8"), ("between_steps_s", "<f8"),
                              ("between_steps_api_calls", "<i8"), ("between_steps_kernel_count", "<i8"),
                              ("between_steps_kernel_s", "<f8"), ("between_steps_copy_count", "<i8"),
                              ("between_steps_copy_bytes", "<i8")] if step_fields else []))
    def text(length):
        return h5py.string_dtype("utf-8", length) if step_fields else f"S{length}"

    api_type = np.dtype([("name", text(64)), ("calls", "<i8"), ("time_s", "<f8")])
    kernel_type = np.dtype([("name", text(192)), ("count", "<i8"), ("time_s", "<f8"), ("nccl", "i1")])
    with h5py.File(path, "a") as f:
        for run in f["runs"].values():
            for r in range(int(run.attrs["world_size"])):
                g = run[f"rank_{r}"]
                s = np.zeros(1, summary_type)
                s["window_s"], s["htod_s"], s["nccl_kernel_s"] = 10.0 + r, rng.uniform(0.1, 1), rng.uniform(0, 1)
                s["htod_count"], s["samples"] = 100, 1000
                s["kernel_count"], s["kernel_s"] = rng.integers(10_000, 90_000), rng.uniform(5, 9)
                if step_fields:
                    s["steps"], s["kernel_busy_s"] = 37 + r, s["kernel_s"] * rng.uniform(0.5, 1)
                    s["between_steps_s"], s["between_steps_kernel_count"] = rng.uniform(0.5, 2), 500 + r
                    s["between_steps_api_calls"], s["between_steps_kernel_s"] = 600 + r, rng.uniform(0, 0.5)
                g.create_dataset("cuda_summary", data=s)
                api = np.zeros(32, api_type)
                for i, name in enumerate([b"cudaLaunchKernel", b"cudaMemcpyAsync", b"cudaStreamSynchronize",
                                          b"cudaGraphLaunch", b"cudaEventSynchronize"]):
                    api[i] = (name, 1000 * (i + 1), rng.uniform(0.1, 3))
                g.create_dataset("cuda_api", data=api)
                kernels = np.zeros(48, kernel_type)
                kernels[0] = (b"ncclDevKernel_AllReduce_Sum_f32_RING_LL", 10, s["nccl_kernel_s"][0], 1)
                g.create_dataset("cuda_kernels", data=kernels)
            if not step_fields:
                status = np.array(run["status"][()], dtype="S16")
                del run["status"]
                run.create_dataset("status", data=status)


@pytest.fixture(scope="module")
def gpu_like(matrix, tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_like")
    for name in ("image.h5", "llm.h5"):
        shutil.copy(matrix / name, d / name)
        add_cuda_tables(d / name)
    return d


def cuda_step_tables(report):
    """The per-step rows of `mgbench report --cuda`, by run id and rank: their cells as text."""
    tables, run_id, lines = {}, None, report.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# ") and ": CUDA activity" in line:
            run_id = line.split()[1]
        if line.split()[:4] == ["#", "rank", "steps", "window/step"]:
            rows = tables.setdefault(run_id, {})
            for row in lines[i + 2:]:  # after the header's two lines
                if row.startswith("#") or not row.strip():
                    break
                rows[int(row.split()[0])] = row.split()[1:]
    return tables


def test_report_cuda_counts_kernels_launches_and_waits_per_step_and_the_busy_share(matrix, tmp_path):
    """Issue 47 (schema 12, 13): `report --cuda`'s per-step table -- the steps in the window, the window per
    step, kernels, launch calls and host waits per step, kernel_busy_s over the window, the time between
    the steps and the kernels there -- equals the same
    arithmetic on the file's cuda tables read with h5py; a file of schema 11's layout (no step fields)
    prints '-' where they are needed, and mgbench_analysis reads it with the writer's defaults. The second
    file's names and statuses are ASCII (h5py's bytes), which HDF5 does not convert to the UTF-8 mgbench
    writes: report read none of it before ("no appropriate function for conversion path")."""
    for step_fields in (True, False):
        path = tmp_path / f"cuda-{step_fields}.h5"
        shutil.copy(matrix / "image.h5", path)
        add_cuda_tables(path, step_fields)
        report = mgbench("report", "--cuda", path, check=True).stdout
        tables = cuda_step_tables(report)
        # The API table's names and the runs' statuses read, in either character set.
        assert re.search(r"^ +cudaLaunchKernel +1000 ", report, re.M) and " completed " in report, report
        with h5py.File(path, "r") as f:
            assert sorted(tables) == sorted(f["runs"]), tables.keys()
            for run_id, run in f["runs"].items():
                world = int(run.attrs["world_size"])
                assert sorted(tables[run_id]) == list(range(world)), tables[run_id]
                for r in range(world):
                    s, api, row = run[f"rank_{r}/cuda_summary"][0], run[f"rank_{r}/cuda_api"][:], tables[run_id][r]
                    calls = {name.decode(): int(n) for name, n in zip(api["name"], api["calls"]) if name}
                    if not step_fields:
                        assert row == ["-"] * 8, row
                        continue
                    steps = int(s["steps"])
                    expected = [str(steps), f"{1e3 * s['window_s'] / steps:.2f}", f"{s['kernel_count'] / steps:.1f}",
                                f"{(calls['cudaLaunchKernel'] + calls['cudaGraphLaunch']) / steps:.1f}",
                                f"{(calls['cudaStreamSynchronize'] + calls['cudaEventSynchronize']) / steps:.1f}",
                                f"{100 * s['kernel_busy_s'] / s['window_s']:.1f}",
                                f"{s['between_steps_s']:.2f}", str(s["between_steps_kernel_count"])]
                    assert row == expected, (run_id, r, row, expected)
        frame = mga.cuda(str(path))  # every run's ranks
        if step_fields:
            assert (frame["steps"] >= 37).all() and (frame["kernel_busy_s"] > 0).all(), frame
            assert (frame["between_steps_kernel_count"] >= 500).all(), frame
        else:
            assert (frame["steps"] == -1).all() and frame["kernel_busy_s"].isna().all(), frame
            assert (frame["between_steps_kernel_count"] == -1).all() and frame["between_steps_s"].isna().all(), frame


def report_csv_tables(directory):
    """`mgbench report --csv DIR`: the image, LLM and DPO tables (blank-line separated) as frames of text."""
    out = mgbench("report", "--csv", directory, check=True).stdout
    return [pd.read_csv(StringIO(block), dtype=str, keep_default_na=False) for block in out.strip().split("\n\n")]


def assert_frame_equals_csv(frame, csv):
    assert list(frame.columns) == list(csv.columns)
    assert len(frame) == len(csv)
    for column in csv.columns:
        for ours, text in zip(frame[column], csv[column]):
            if text == "-":
                assert ours is None or pd.isna(ours), (column, ours)
            elif text.lstrip("-").replace(".", "", 1).isdigit():
                # Printed with d decimals: equal to within half a unit of the last digit.
                d = len(text.split(".")[1]) if "." in text else 0
                assert abs(float(ours) - float(text)) <= 0.5 * 10 ** -d + 1e-12, (column, ours, text)
            else:
                assert str(ours) == text, (column, ours, text)


def test_runs_frame_equals_report_csv(matrix):
    frame = mga.runs(matrix)
    image_csv, llm_csv, dpo_csv, comm_csv, repeats_csv = report_csv_tables(matrix)
    # 2 collectives x 4 sizes (64 B .. 32 KiB, x8) x 2 placements, one line each (the ranks summarised)
    assert comm_csv.columns[6] == "collective" and len(comm_csv) == 2 * 4 * 2
    assert len(image_csv) == 9 and len(llm_csv) == 5 and len(dpo_csv) == 1
    assert_frame_equals_csv(mga.report_table(frame, "image"), image_csv)
    assert_frame_equals_csv(mga.report_table(frame, "llm"), llm_csv)
    assert_frame_equals_csv(mga.report_table(frame, "dpo"), dpo_csv)
    # The resumed run is the 2-rank fp32 run's workload again: its spread, as the report's repeats table.
    repeats = mga.repeats(matrix)
    assert_frame_equals_csv(repeats, repeats_csv)
    assert set(repeats["metric"]) >= {"img/s", "s/epoch"} and (repeats["runs"] == 2).all()
    row = repeats[repeats["metric"] == "img/s"].iloc[0]
    assert row["min"] <= row["median"] <= row["max"] and row["cv_pct"] >= 0
    # The efficiencies are there to compare (not all "-"): 2-rank runs have 1-rank peers, fp32 an fp64 one.
    assert image_csv["efficiency_vs_1_rank_pct"].ne("-").sum() >= 7
    assert image_csv["efficiency_vs_fp64_pct"].ne("-").sum() >= 2
    assert llm_csv["efficiency_vs_1_rank_pct"].ne("-").sum() >= 3
    resumed = frame[frame["file"].str.endswith("resumed.h5")].iloc[0]
    assert resumed["status"] == "completed" and resumed["resumes"] == 1
    # Every attribute of a run is a column, typed as written.
    assert frame["image_size"].dropna().map(type).eq(int).all() and set(frame["strategy"].dropna()) == {"ddp", "ddp-ds"}


def test_efficiencies_pair_only_runs_of_one_workload_identity(matrix, tmp_path):
    """Runs of other hardware or model widths never pair: the image matrix with the 1-rank fp32 runs
    re-labelled as an A100's and the 1-rank fp64 48 px run as width 1.0 (CPU runs with edited attributes
    standing in for other hardware); `mgbench report` and the frames agree on it and on the notes."""
    shutil.copy(matrix / "image.h5", tmp_path / "image.h5")
    with h5py.File(tmp_path / "image.h5", "r+") as f:
        runs = list(f["runs"].values())
        for one_rank_fp32 in [r for r in runs if r.attrs["world_size"] == 1 and r.attrs["precision"] == "fp32"]:
            one_rank_fp32.attrs["device"], one_rank_fp32.attrs["gpu_model"] = "cuda", "NVIDIA A100-SXM4-80GB"
        wide = [r for r in runs if r.attrs["world_size"] == 1 and r.attrs["image_size"] == 48][0]
        wide.attrs["width_mult"] = 1.0
    frame = mga.runs(tmp_path)
    image_csv = report_csv_tables(tmp_path)[0]
    assert_frame_equals_csv(mga.report_table(frame, "image"), image_csv)
    two_ranks = frame[frame["ranks"] == 2]
    unpaired = two_ranks[(two_ranks["precision"] == "fp32") | (two_ranks["image_size"] == 48)]
    assert len(unpaired) == 3 and unpaired["efficiency_vs_1_rank"].isna().all()
    paired = two_ranks[(two_ranks["precision"] == "fp64") & (two_ranks["image_size"] == 32)]
    assert len(paired) == 1 and paired["efficiency_vs_1_rank"].notna().all()
    notes = unpaired.set_index("image_size")["baseline_note"]
    # The nearest 1-rank run is the one of fewest differences: for fp32 at 32 px the fp64 one.
    assert all("no 1-rank run of this workload on cpu; the nearest, " in note for note in notes[32])
    assert all(note.endswith("differs in precision 'fp32' vs 'fp64'") for note in notes[32])
    assert "differs in width_mult '0.25' vs '1'" in notes[48]
    table = mgbench("report", tmp_path / "image.h5", check=True).stdout
    for note in unpaired["baseline_note"]:
        assert f"# {note}\n" in table
    assert frame.groupby("workload").ngroups == len(set(frame["workload"]))


def test_llm_efficiency_pairs_only_runs_timed_over_the_same_steps(matrix, tmp_path):
    """tokens/s leaves --warmup-steps-excluded steps out: the 1-rank runs re-labelled as timed after 3
    steps are no baseline for the 2-rank run timed over all of its steps (its efficiency mixed the two)."""
    shutil.copy(matrix / "llm.h5", tmp_path / "llm.h5")
    before = mga.runs(tmp_path)
    assert before[before["ranks"] == 2]["efficiency_vs_1_rank"].notna().all()
    with h5py.File(tmp_path / "llm.h5", "r+") as f:
        for run in f["runs"].values():
            if run.attrs["world_size"] == 1:
                run.attrs["warmup_steps_excluded"] = 3
    frame = mga.runs(tmp_path)
    llm = frame[frame["task"] == "llm"]
    assert llm[llm["ranks"] == 2]["efficiency_vs_1_rank"].isna().all()
    assert llm[llm["ranks"] == 1]["efficiency_vs_1_rank"].notna().all()  # a 1-rank run is its own peer
    assert_frame_equals_csv(mga.report_table(frame, "llm"), report_csv_tables(tmp_path)[0])


def test_reference_frame_equals_report_csv(matrix, tmp_path):
    """`mga.compare` equals `mgbench report --reference --csv` for every kind of run (image, LLM, comm
    busbw); copies of the files against them hold everywhere. The same file on both sides is refused by
    both (its runs judged by themselves always held)."""
    files = [matrix / "image.h5", matrix / "llm.h5", matrix / "comm.h5"]
    references = [shutil.copy(f, tmp_path / f.name) for f in files]
    same = mgbench("report", "--reference", ",".join(map(str, files)), files[0])
    assert same.returncode == 2 and f"'{files[0]}' is among both the reference" in same.stderr, same.stderr
    with pytest.raises(mga.ResultsError, match="is among both the reference and the files judged"):
        mga.compare(files, files[0])
    # Recorded on a GPU (gpu_model as runtime/device.cpp writes it): the device cell is the model alone.
    judged = tmp_path / "judged"
    judged.mkdir()
    files = [shutil.copy(f, judged / f.name) for f in files]
    for path in [*references, *files]:
        with h5py.File(path, "r+") as f:
            for run in f["runs"].values():
                run.attrs["gpu_model"] = "NVIDIA H100 80GB HBM3, 79.2 GiB, sm_90"
    csv = pd.read_csv(StringIO(mgbench("report", "--csv", "--reference", ",".join(map(str, references)), *files,
                                       check=True).stdout), dtype=str, keep_default_na=False)
    frame = mga.compare(references, files)
    assert list(frame.columns) == list(csv.columns) and len(frame) == len(csv)
    assert (frame["device"] == "H100-80GB-HBM3").all() and list(frame["device"]) == list(csv["device"])
    assert set(frame["metric"]) >= {"img/s", "s/epoch", "tokens/s", "s/it", "peak_MiB"}
    assert frame["metric"].str.startswith("busbw:all-reduce:fp32:").sum() == 2
    assert list(frame["metric"]) == list(csv["metric"]) and list(frame["run_id"]) == list(csv["run_id"])
    assert (frame["verdict"] == "holds").all() and (csv["verdict"] == "holds").all() and mga.passed(frame)
    assert (abs(frame["measured"] - csv["measured"].astype(float)) <= 1e-6 * frame["measured"] + 1e-6).all()


def test_per_rank_frames_equal_the_files(matrix):
    runs = mga.read(matrix)
    steps, epochs = mga.steps(runs), mga.epochs(runs)
    for path in sorted(matrix.glob("*.h5")):
        with h5py.File(path, "r") as f:
            for run_id, run in f["runs"].items():
                if run.attrs["task"] == "comm":
                    continue  # no steps: its rows are rank_<r>/comm (test_comm.py)
                for r in range(int(run.attrs["world_size"])):
                    raw = run[f"rank_{r}/steps"][:]
                    raw = raw[raw["epoch"] >= 0]
                    ours = steps[(steps["file"] == str(path)) & (steps["run_id"] == run_id) & (steps["rank"] == r)]
                    assert len(ours) == len(raw) > 0
                    for field in ("step_s", "forward_s", "loss", "samples", "tokens"):
                        assert np.array_equal(ours[field].to_numpy(), raw[field], equal_nan=True), field
                    raw_epochs = run[f"rank_{r}/epochs"][:]
                    ours = epochs[(epochs["file"] == str(path)) & (epochs["run_id"] == run_id) & (epochs["rank"] == r)]
                    assert np.array_equal(ours["train_s"].to_numpy(), raw_epochs[raw_epochs["epoch"] >= 0]["train_s"])
                if "metrics" in run["rank_0"]:  # DPO: the recipe's metrics as step columns
                    metrics = run["rank_0/metrics"][:]
                    ours = steps[(steps["run_id"] == run_id) & (steps["rank"] == 0)]
                    assert np.allclose(ours["reward_margin"], metrics[: len(ours), 3], equal_nan=True)
    # The resumed run: every step row written once, as an uninterrupted run (8 steps per rank per epoch).
    resumed = steps[steps["file"].str.endswith("resumed.h5")]
    assert len(resumed) == 2 * 2 * 4 and not resumed.duplicated(["rank", "epoch", "step"]).any()
    assert mga.cuda(runs).empty  # CPU runs: no CUPTI tables


def drop_fields(table, names):
    """A compound dataset rewritten without the fields `names` (an older schema's layout)."""
    data = table[()]
    kept = [n for n in data.dtype.names if n not in names]
    group, name = table.parent, table.name.split("/")[-1]
    del group[name]
    group.create_dataset(name, data=np.array(data[kept].tolist(), dtype=[(n, data.dtype[n]) for n in kept]))


def test_the_figures_count_the_launch_and_wait_apis_report_counts():
    """Figs. 3, 5 and 6 sum the CUPTI API rows `report --cuda` sums (results/schema.h's kLaunchApis and
    kHostWaitApis), so that a figure and the report never disagree on what a launch is."""
    from mgbench_analysis import figures
    header = (Path(__file__).resolve().parents[2] / "modules" / "results" / "schema.h").read_text()

    def names(array):
        body = re.search(rf"{array}\[\] = {{(.*?)}};", header, re.S)
        assert body, array
        return tuple(re.findall(r'"(\w+)"', body.group(1)))

    assert figures.LAUNCH_APIS == names("kLaunchApis")
    assert figures.HOST_WAIT_APIS == names("kHostWaitApis")


def test_fields_an_older_schema_lacks_read_as_the_writers_defaults(matrix, tmp_path):
    """Steps and epochs of a file written before a field existed (page_faults: schema 11; allgather_s,
    reducescatter_s: 5; skipped_images: 8; eval_loss: 3) read as mgbench's own reader reads them: the
    writer's defaults (results/schema.h), not NaN or a missing column; the summary's checkpoint_s
    (schema 14) as NaN."""
    path = tmp_path / "old.h5"
    shutil.copy(matrix / "image.h5", path)
    with h5py.File(path, "a") as f:
        for run in f["runs"].values():
            for r in range(int(run.attrs["world_size"])):
                drop_fields(run[f"rank_{r}/steps"],
                            {"page_faults", "allgather_s", "reducescatter_s", "lr", "cuda_graph"})
                drop_fields(run[f"rank_{r}/epochs"], {"skipped_images", "eval_loss", "allgather_s"})
            drop_fields(run["summary"], {"checkpoint_s"})
    runs = mga.read(path)
    steps, epochs, frame = mga.steps(runs), mga.epochs(runs), mga.runs(runs)
    assert len(steps) > 0 and len(epochs) > 0
    assert (steps["page_faults"] == -1).all() and (steps["allgather_s"] == 0).all()
    assert (steps["cuda_graph"] == -1).all()
    assert (steps["reducescatter_s"] == 0).all() and steps["lr"].isna().all()
    assert (epochs["skipped_images"] == 0).all() and epochs["eval_loss"].isna().all() and (epochs["allgather_s"] == 0).all()
    assert frame["checkpoint_s"].isna().all()
    # The file as written holds them: a run's own rows keep their values.
    fresh = mga.steps(mga.read(matrix / "image.h5"))
    assert (fresh["page_faults"] >= 0).all() and fresh["lr"].notna().all()
    assert (fresh["cuda_graph"] == 0).all()  # eager: a CPU run has no graphs


def test_report_cuda_counts_rank_0s_steps_by_what_cuda_graphs_did_in_them(matrix, tmp_path):
    """Schema 15: `report --cuda` counts rank 0's steps by their `cuda_graph` (eager, captured, replayed,
    mixed) with each kind's mean step time, as the same arithmetic on the file's rows read with h5py,
    for a run whose graphs were on; a run without graphs, or one of schema 14 (no field), prints no
    such line."""
    path, old = tmp_path / "graphs.h5", tmp_path / "old.h5"
    shutil.copy(matrix / "image.h5", path)
    with h5py.File(path, "a") as f:
        run_id = sorted(f["runs"])[0]
        run = f["runs"][run_id]
        run.attrs["cuda_graphs_decision"] = "on"
        steps = run["rank_0/steps"]
        rows = steps[()]
        written = np.flatnonzero(rows["epoch"] >= 0)
        assert len(written) >= 5, len(written)
        kinds = np.full(len(rows), -1, dtype=np.int8)
        kinds[written] = 2  # replayed ...
        kinds[written[:3]] = [0, 1, 3]  # ... but a warm-up, a capture and a mixed step
        rows["cuda_graph"] = kinds
        steps[...] = rows
    shutil.copy(path, old)
    with h5py.File(old, "a") as f:
        for run in f["runs"].values():
            for r in range(int(run.attrs["world_size"])):
                drop_fields(run[f"rank_{r}/steps"], {"cuda_graph"})
    line = re.compile(r"^# cuda graphs \(rank 0's steps\): (.*)$", re.M)
    found = line.findall(mgbench("report", "--cuda", path, check=True).stdout)
    assert len(found) == 1, found  # only the run whose graphs were on
    step_s = rows["step_s"][written]
    expected = [f"{len(written) - 3} replayed (mean {1e3 * step_s[3:].mean():.2f} ms)",
                f"1 captured (mean {1e3 * step_s[1]:.2f} ms)", f"1 mixed (mean {1e3 * step_s[2]:.2f} ms)",
                f"1 eager (mean {1e3 * step_s[0]:.2f} ms)"]
    assert found[0] == ", ".join(expected), found
    assert not line.search(mgbench("report", "--cuda", old, check=True).stdout)
    assert (mga.steps(mga.read(old))["cuda_graph"] == -1).all()


def lines(ax):
    return {line.get_label(): line.get_xydata() for line in ax.get_lines() if not line.get_label().startswith("_")}


def bars(ax):
    return {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}


def test_every_figure_is_drawn_and_shows_the_frames_data(matrix, gpu_like, tmp_path):
    sources = [matrix / "resumed.h5", matrix / "comm.h5", gpu_like / "image.h5", gpu_like / "llm.h5"]
    written, skipped = plot_all(sources, str(tmp_path / "figs"), "png", overlay=True, log=lambda _: None)
    assert skipped == [] and {n for n, _ in written} == {s.name for s in figs.FIGURES}
    assert all(os.path.getsize(p) > 10_000 for _, p in written)
    data = figs.Data(mga.read(sources))
    runs = data.runs
    image = runs[(runs["task"] == "image") & (runs["status"] == "completed")]

    # Fig. 1: time per strategy and rank count (fp32, pin false, 32 px).
    fig1 = figs.draw("fig1_strategy_scaling", data)
    point = image[(image["precision"] == "fp32") & (image["pin_memory"] == "false") & (image["image_size"] == 32)]
    expected = point.groupby(["strategy", "ranks"])["total_s"].mean()
    got = lines(fig1.axes[0])
    assert set(got) == {"ddp", "ddp-ds"}
    for strategy, xy in got.items():
        assert np.allclose(xy[:, 1], expected[strategy].to_numpy()) and list(xy[:, 0]) == list(expected[strategy].index)

    # Fig. 2: fp64 ddp-ds, time vs image size per rank count, and the efficiency of 2 ranks.
    fig2 = figs.draw("fig2_time_efficiency_vs_size", data)
    fp64 = image[(image["precision"] == "fp64") & (image["strategy"] == "ddp-ds")]
    for ranks in (1, 2):
        xy = lines(fig2.axes[0])[f"ranks {ranks}"]
        rows = fp64[fp64["ranks"] == ranks].sort_values("image_size")
        assert list(xy[:, 0]) == [32, 48] and np.allclose(xy[:, 1], rows["total_s"])
    xy = lines(fig2.axes[1])["ranks 2"]
    assert np.allclose(xy[:, 1], 100 * fp64[fp64["ranks"] == 2].sort_values("image_size")["efficiency_vs_1_rank"])

    # Table 2 as a figure, with the paper's points overlaid (--paper).
    table2 = figs.draw("table2_precision_scaling", data, overlay=True)
    fp32_vs_fp64 = lines(table2.axes[2])["fp32"]
    rows = point[(point["strategy"] == "ddp-ds")].groupby("ranks")["efficiency_vs_fp64"].mean()
    assert np.allclose(fp32_vs_fp64[:, 1], 100 * rows.to_numpy())
    assert np.allclose(lines(table2.axes[1])["paper fp16"][:, 1], [100, 171.41, 236.12, 269.53])

    # Fig. 3: the four metrics, % of the profile window, mean over ranks, per image run.
    fig3 = figs.draw("fig3_profiler_metrics", data)
    summary, api = mga.cuda(sources), mga.cuda(sources, "api")
    first = image[image["ranks"] == 2].iloc[0]  # two ranks, two windows
    s = summary[(summary["file"] == first["file"]) & (summary["run_id"] == first["run_id"])]
    a = api[(api["file"] == first["file"]) & (api["run_id"] == first["run_id"])]
    # Launches: eager and graph launches; waits: stream and event syncs (report --cuda's sums).
    window = s.set_index("rank")["window_s"]
    launch = a[a["name"].isin(["cudaLaunchKernel", "cudaGraphLaunch"])].groupby("rank")["time_s"].sum()
    wait = a[a["name"].isin(["cudaStreamSynchronize", "cudaEventSynchronize"])].groupby("rank")["time_s"].sum()
    got = bars(fig3.axes[0])
    labels = [t.get_text() for t in fig3.axes[0].get_xticklabels()]
    k = labels.index(first["label"])
    assert len(window) == 2 and window.nunique() == 2  # each rank's share of its own window, then the mean
    assert math.isclose(got["kernel launches"][k], 100 * (launch / window).mean())
    assert math.isclose(got["host waits"][k], 100 * (wait / window).mean())
    assert math.isclose(got["CUDA memcpy HtoD"][k], 100 * (s["htod_s"] / s["window_s"]).mean())

    # Fig. 4: s/it per dataset and rank count (lora runs).
    fig4 = figs.draw("fig4_llm_iteration_times", data)
    lora = runs[(runs["recipe"] == "lora") & (runs["status"] == "completed")]
    got = bars(fig4.axes[0])
    assert math.isclose(got["ranks 2"][0], lora[(lora["dataset"] == "alpaca") & (lora["ranks"] == 2)]["s_per_it"].mean())
    assert math.isclose(got["ranks 1"][1], lora[(lora["dataset"] == "samsum") & (lora["ranks"] == 1)]["s_per_it"].mean())

    # Phases: each bar segment is the phase summed over epochs per optimizer step of the rank, mean over
    # ranks, in ms.
    phases = figs.draw("phase_breakdown", data)
    ep = data.epochs
    ax = phases.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    row = runs.iloc[0]
    mine = ep[(ep["file"] == row["file"]) & (ep["run_id"] == row["run_id"])]
    my_steps = data.steps[(data.steps["file"] == row["file"]) & (data.steps["run_id"] == row["run_id"])]
    backward = (mine.groupby("rank")["backward_s"].sum() / my_steps.groupby("rank").size()).mean() * 1e3
    (container,) = [c for c in ax.containers if c.get_label() == "backward"]
    assert math.isclose(container.patches[labels.index(row["label"])].get_width(), backward)

    # Loss per epoch: mean over ranks of each epoch's loss_mean; test accuracy in percent.
    loss = figs.draw("loss_accuracy_per_epoch", data)
    xy = lines(loss.axes[0])[row["label"]]
    assert np.allclose(xy[:, 1], mine.groupby("epoch")["loss_mean"].mean())
    acc = lines(loss.axes[1])[row["label"]]
    assert np.allclose(acc[:, 1], 100 * mine.groupby("epoch")["test_accuracy"].first())

    # Step timeline: one line per rank, (start_s, step_s) of its steps, broken (NaN) between epochs.
    timeline = figs.draw("step_timeline", data)
    st = data.steps
    for ax in timeline.axes:
        run = runs[runs["label"] == ax.get_title()].iloc[0]
        for rank, xy in lines(ax).items():
            mine = st[(st["file"] == run["file"]) & (st["run_id"] == run["run_id"]) &
                      (st["rank"] == int(rank.split()[1]))]
            assert np.isnan(xy).any(axis=1).sum() == mine["epoch"].nunique() - 1
            assert np.allclose(xy[~np.isnan(xy).any(axis=1)], mine[["start_s", "step_s"]].to_numpy())

    # LLM recipes: tokens/s and peak memory per recipe.
    recipes = figs.draw("llm_recipes", data)
    completed_llm = runs[(runs["task"] == "llm") & (runs["status"] == "completed")]
    per_recipe = completed_llm.groupby("recipe")[["tokens_per_s", "peak_memory_mib"]].mean()
    assert np.allclose(bars(recipes.axes[1])["tokens/s"], per_recipe["tokens_per_s"])
    assert np.allclose(bars(recipes.axes[2])["peak memory"], per_recipe["peak_memory_mib"])

    # Collectives: bus bandwidth from the time averaged over ranks, with nccl-tests' factors at 3 ranks:
    # all-reduce 2(n-1)/n = 4/3, all-gather (n-1)/n = 2/3.
    bandwidth = figs.draw("comm_bandwidth", data)
    rows = mga.comm(sources)
    for collective, factor in (("all-reduce", 4 / 3), ("all-gather", 2 / 3)):
        mine = rows[(rows["collective"] == collective) & (rows["in_place"] == 0)]
        mean_time = mine.groupby("bytes")["time_s"].mean()
        xy = lines(bandwidth.axes[1])[f"{collective} fp32 mpi 3r"]
        assert list(xy[:, 0]) == list(mean_time.index)
        assert np.allclose(xy[:, 1], mean_time.index / mean_time.to_numpy() / 1e9 * factor)

    # Fig. 6: pin_memory true vs false, summed over ranks.
    fig6 = figs.draw("fig6_cuda_api_pin_memory", data)
    ticks = [t.get_text() for t in fig6.axes[0].get_xticklabels()]
    assert ticks == ["1 rank(s), pin false", "1 rank(s), pin true", "2 rank(s), pin false"]


def synthetic_run(run_id, ranks=2, epochs=2, steps_per_epoch=4, eval_s=3.0):
    """A completed image run built in memory, as results.read_file returns one (no binary, no file): per
    rank, `epochs` epochs of `steps_per_epoch` steps with an evaluation of `eval_s` seconds between
    epochs (no steps then), and each phase a tenth of an epoch's training time. Start times differ
    between ranks, so that a plotted point tells its rank and epoch."""
    steps, epochs_ = [], []
    for r in range(ranks):
        rows = []
        for e in range(epochs):
            start = e * (steps_per_epoch * 0.5 + eval_s) + 0.01 * r
            for k in range(steps_per_epoch):
                rows.append(dict(epoch=e, step=k, start_s=start + 0.5 * k, step_s=0.45 + 0.01 * k + 0.02 * r))
        steps.append(pd.DataFrame(rows))
        train_s = steps_per_epoch * 0.5
        epochs_.append(pd.DataFrame([dict(epoch=e, train_s=train_s, eval_s=eval_s,
                                          **{f: train_s / (len(mga.PHASES) + 1) for _, f in mga.PHASES}) for e in range(epochs)]))
    total = epochs * (steps_per_epoch * 0.5 + eval_s)
    attributes = dict(task="image", world_size=ranks, strategy="ddp-ds", precision="fp32", image_size=32,
                      pin_memory="false", epochs=epochs, batch_size=32, train_samples=256)
    summary = dict(mga.results._SUMMARY_DEFAULTS, total_s=total, train_s=epochs * steps_per_epoch * 0.5,
                   eval_s=epochs * eval_s, epochs_completed=epochs)
    return mga.Run("synthetic.h5", run_id, attributes, "completed", "", summary, steps=steps, epochs=epochs_)


def rendered(fig):
    """The figure drawn with Agg (as `mgbench-plot` saves it), so that artists have their window extents."""
    FigureCanvasAgg(fig).draw()
    return fig


def overlap(a, b):
    """Whether two display boxes share an area (touching edges do not count)."""
    return min(a.x1, b.x1) - max(a.x0, b.x0) > 0.5 and min(a.y1, b.y1) - max(a.y0, b.y0) > 0.5


@pytest.mark.parametrize("count", [1, 3, 12])
def test_phase_breakdown_legend_covers_no_bar_and_is_in_the_figure(count):
    fig = rendered(figs.draw("phase_breakdown", figs.Data([synthetic_run(f"run_{i}") for i in range(count)])))
    (ax,) = fig.axes
    legend = ax.get_legend() or (fig.legends[0] if fig.legends else None)
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == [name for name, _ in mga.PHASES] + ["other"]
    box = legend.get_window_extent()
    assert sum(len(c.patches) for c in ax.containers) == (len(mga.PHASES) + 1) * count
    # Every run's bar fills the data area's width: a legend inside it would cover some bar.
    assert not [(c.get_label(), i) for c in ax.containers for i, p in enumerate(c.patches)
                if overlap(box, p.get_window_extent())]
    texts = [fig._suptitle, ax.xaxis.label, *ax.get_yticklabels(), *ax.get_xticklabels()]
    assert not [t.get_text() for t in texts if t.get_text() and overlap(box, t.get_window_extent())]
    # Inside the figure: what savefig writes (without bbox_inches="tight", as `mgbench-plot`).
    assert fig.bbox.containsx(box.x0) and fig.bbox.containsx(box.x1)
    assert fig.bbox.containsy(box.y0) and fig.bbox.containsy(box.y1)


def test_step_timeline_draws_no_line_across_the_evaluation_between_epochs():
    data = figs.Data([synthetic_run("run_0", ranks=2, epochs=3)])
    (ax,) = rendered(figs.draw("step_timeline", data)).axes
    st = data.steps
    where = {x: (rank, epoch) for x, rank, epoch in st[["start_s", "rank", "epoch"]].itertuples(index=False)}
    drawn, colors = [], {}
    for line in ax.get_lines():
        xy = line.get_xydata()
        for a, b in zip(xy[:-1], xy[1:]):
            if np.isfinite(a).all() and np.isfinite(b).all():  # a drawn segment
                assert where[a[0]][1] == where[b[0]][1], f"{line.get_label()}: {a} -> {b} spans an evaluation"
        points = xy[np.isfinite(xy).all(axis=1)]
        ranks = {where[x][0] for x in points[:, 0]}
        assert len(ranks) == 1  # a line shows one rank, in that rank's colour
        colors.setdefault(ranks.pop(), set()).add(line.get_color())
        drawn.extend(map(tuple, points))
    # Every step drawn once; one colour per rank, one legend entry per rank.
    assert sorted(drawn) == sorted(map(tuple, st[["start_s", "step_s"]].to_numpy()))
    assert all(len(c) == 1 for c in colors.values()) and len(set.union(*colors.values())) == 2
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["rank 0", "rank 1"]


def plot_cli(*args):
    return subprocess.run([sys.executable, "-m", "mgbench_analysis.cli", *map(str, args)], capture_output=True,
                          text=True, env=PY_ENV, timeout=300)


def test_figures_without_data_are_skipped_saying_what_they_need(matrix, tmp_path):
    proc = plot_cli(matrix / "llm.h5", "--out", tmp_path, "--format", "svg")
    assert proc.returncode == 0, proc.stderr
    for spec in figs.FIGURES:
        written = (tmp_path / f"{spec.name}.svg").exists()
        line = f"mgbench-plot: skipped {spec.name}: needs {spec.needs}"
        assert written != (line in proc.stdout), (spec.name, proc.stdout)
    assert (tmp_path / "fig4_llm_iteration_times.svg").exists()
    assert "skipped fig1_strategy_scaling: needs completed image runs" in proc.stdout
    # A results file may hold no runs (a job that failed before its first): every figure skipped, exit 0
    # (was exit 2, "no results file given", from the CUDA frames of an empty run list).
    empty = tmp_path / "no_runs.h5"
    write_other_hdf5(empty, schema="mgbench-results", schema_version=15)
    proc = plot_cli(empty, "--out", tmp_path / "none", "--format", "svg")
    assert proc.returncode == 0 and proc.stdout.count("mgbench-plot: skipped ") == len(figs.FIGURES), proc.stdout
    assert mga.steps(mga.read(empty)).empty


def test_report_plot_writes_the_figures_and_the_page(matrix, tmp_path):
    out = tmp_path / "plots"
    proc = mgbench("report", "--plot", out, matrix / "image.h5")
    assert proc.returncode == 0, proc.stderr
    assert "# mgbench report: 8 run(s)" in proc.stdout  # the tables are printed as without --plot
    assert (out / "fig1_strategy_scaling.png").exists() and (out / "index.html").exists()
    assert "table2_precision_scaling.png" in (out / "index.html").read_text()
    # A folder that cannot be made (under a file): named, no traceback, no install advice, exit 1.
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    bad = mgbench("report", "--plot", blocked / "plots", matrix / "image.h5")
    assert bad.returncode == 1 and "mgbench-plot: cannot write the figures" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr and "pip install" not in bad.stderr, bad.stderr


def write_other_hdf5(path, **attrs):
    with h5py.File(path, "w") as f:
        f.create_group("runs")
        for k, v in attrs.items():
            f.attrs[k] = v


@pytest.mark.parametrize("case", ["text", "other_schema", "no_schema", "newer_version", "no_match", "empty_dir",
                                  "missing", "fifo"])
def test_bad_input_is_named(tmp_path, case):
    release = None
    if case == "fifo":
        target = tmp_path / "pipe.h5"
        os.mkfifo(target)
        expected = f"results file '{target}' is not a regular file (a FIFO)"
        # Were the FIFO opened, the reader would block: a writer after 30 s releases it, so that a
        # regression fails here instead of hanging the suite.
        release = threading.Timer(30, lambda: os.close(os.open(target, os.O_WRONLY)))
        release.daemon = True
        release.start()
    elif case == "text":
        target = tmp_path / "notes.h5"
        target.write_text("not HDF5")
        expected = f"'{target}' is not an HDF5 file"
    elif case == "other_schema":
        target = tmp_path / "other.h5"
        write_other_hdf5(target, schema="something-else")
        expected = f"'{target}' is not an mgbench results file"
    elif case == "no_schema":  # a /runs group alone: `mgbench report` read it, mgbench_analysis did not
        target = tmp_path / "bare.h5"
        write_other_hdf5(target)
        expected = f"'{target}' is not an mgbench results file"
    elif case == "newer_version":
        target = tmp_path / "future.h5"
        write_other_hdf5(target, schema="mgbench-results", schema_version=99)
        expected = f"'{target}' has results schema version 99"
    elif case == "no_match":
        target = tmp_path / "*.h5"
        expected = f"no file matches '{target}'"
    elif case == "empty_dir":
        target = tmp_path
        expected = f"no results file (*.h5) below '{target}'"
    else:
        target = tmp_path / "absent.h5"
        expected = f"results file '{target}' does not exist"
    with pytest.raises(mga.ResultsError, match=None) as error:
        mga.runs(target)
    assert expected in str(error.value)
    proc = plot_cli(target, "--out", tmp_path / "figs")
    assert proc.returncode == 2 and expected in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    if case in ("other_schema", "no_schema"):  # the C++ readers judge a file as mgbench_analysis does
        proc = mgbench("report", target)
        assert proc.returncode == 1 and expected in proc.stderr, proc.stderr
    if release is not None:
        release.cancel()


def chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.browser
def test_html_page_renders_every_image_in_headless_chromium(matrix, tmp_path):
    browser = chromium()
    if browser is None:
        pytest.skip("no Chromium (Debian package chromium; scripts/install-deps.sh installs it)")
    site = tmp_path / "site"
    proc = plot_cli(matrix / "image.h5", matrix / "llm.h5", "--html", site)
    assert proc.returncode == 0, proc.stderr
    page = (site / "index.html").read_text()
    images = page.count("<img ")
    assert images == len([s for s in figs.FIGURES if (site / f"{s.name}.png").exists()]) >= 8
    # The page is loaded in a frame of a harness page that counts, after load, the images that decoded
    # (naturalWidth > 0) and those that did not; --dump-dom prints the harness's DOM with the verdict.
    harness = site / "harness.html"
    harness.write_text("""<!DOCTYPE html><html><body><iframe id="page" src="index.html"></iframe><script>
document.getElementById('page').onload = function () {
  const imgs = Array.from(this.contentDocument.images);
  const broken = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src'));
  const verdict = document.createElement('pre'); verdict.id = 'verdict';
  verdict.textContent = 'images=' + imgs.length + ' broken=' + broken.length + ' [' + broken.join(',') + ']';
  document.body.appendChild(verdict);
};
</script></body></html>""")

    def verdict():
        proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                               "--allow-file-access-from-files", "--virtual-time-budget=10000", "--dump-dom",
                               harness.as_uri()], capture_output=True, text=True, timeout=120)
        return proc.stdout + proc.stderr[-2000:]

    assert f"images={images} broken=0 []" in verdict()
    (site / "step_timeline.png").unlink()  # the check sees a broken image
    assert f"images={images} broken=1 [step_timeline.png]" in verdict()


GET_MNIST = Path(__file__).resolve().parents[2] / "scripts" / "get-mnist.sh"


def test_get_mnist_prefers_the_shared_copy_and_refuses_a_wrong_checksum(tmp_path):
    proc = subprocess.run([GET_MNIST], capture_output=True, text=True, timeout=60,
                          env=dict(ENV, MGBENCH_SHARED_MNIST=str(MNIST), MGBENCH_DATA_CACHE=str(tmp_path / "cache")))
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == str(MNIST.resolve()), proc.stderr
    # A mirror that serves files of the right names and the wrong content: each is refused; with
    # --official (the tests' data script) that is the end, exit 1, nothing unverified kept.
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                 "t10k-labels-idx1-ubyte.gz"):
        (mirror / name).write_bytes(b"not mnist")
    server = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"], cwd=mirror,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = server.stdout.readline().split("port ")[1].split()[0]
        env = dict(ENV, MGBENCH_SHARED_MNIST=str(tmp_path / "none"), MGBENCH_DATA_CACHE=str(tmp_path / "cache"),
                   MGBENCH_MNIST_MIRRORS=f"http://127.0.0.1:{port}/")
        official = subprocess.run([GET_MNIST, "--official"], capture_output=True, text=True, timeout=120, env=env)
        fashion = Path("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz").exists()
        fallback = (subprocess.run([GET_MNIST], capture_output=True, text=True, timeout=120, env=env)
                    if fashion else None)
    finally:
        server.kill()
    assert official.returncode == 1, official.stderr
    assert f"http://127.0.0.1:{port}/train-images-idx3-ubyte.gz: wrong md5" in official.stderr
    assert not list((tmp_path / "cache" / "mnist").glob("*.gz"))  # nothing unverified kept
    if not fashion:
        not_here("Debian's dataset-fashion-mnist is not installed (the fallback would install it)")
    # Without --official the script falls back to Debian's Fashion-MNIST and says so.
    assert fallback.returncode == 0, fallback.stderr
    assert "falling back to Fashion-MNIST" in fallback.stderr
    assert fallback.stdout.splitlines()[-1] == "/usr/share/datasets/fashion-mnist"
    assert not list((tmp_path / "cache" / "mnist").glob("*.gz"))


def test_stragglers_names_the_rank_slow_outside_the_collectives():
    even = synthetic_run("even")
    assert mga.stragglers([even]).empty  # equal ranks: nobody straggles
    slow = synthetic_run("slow")
    slow.epochs[1] = slow.epochs[1].assign(forward_s=slow.epochs[1]["forward_s"] + 0.5,
                                           allreduce_s=0.0)  # rank 1 computes, rank 0 waits for it
    slow.epochs[0] = slow.epochs[0].assign(allreduce_s=slow.epochs[0]["allreduce_s"] + 0.5)
    slow.rank_attributes = [{"hostname": "a"}, {"hostname": "b"}]
    frame = mga.stragglers([slow])
    assert list(frame["rank"]) == [1] and list(frame["host"]) == ["b"] and list(frame["phase"]) == ["forward"]


def test_scaling_figures_show_the_spread_of_repeated_runs(matrix):
    """A point run more than once (the 2-rank fp32 run and its resumed repeat) is drawn at the median
    of its runs with a bar from their min to their max; single runs get no bar."""
    from matplotlib.container import ErrorbarContainer
    data = figs.Data(mga.read([matrix / "image.h5", matrix / "resumed.h5"]))
    fig = figs.draw("fig1_strategy_scaling", data)
    runs = data.runs
    point = runs[(runs["task"] == "image") & (runs["precision"] == "fp32") & (runs["pin_memory"] == "false")
                 & (runs["image_size"] == 32) & (runs["strategy"] == "ddp-ds") & (runs["ranks"] == 2)]
    assert len(point) == 2
    bars = [c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 1
    (segments,) = [col.get_segments() for col in bars[0].lines[2]]
    assert len(segments) == 1
    (x0, low), (x1, high) = segments[0]
    assert x0 == x1 == 2 and math.isclose(low, point["total_s"].min()) and math.isclose(high, point["total_s"].max())
    median = dict(lines(fig.axes[0])["ddp-ds"])[2]
    assert math.isclose(median, point["total_s"].median())


def _package_imports():
    """Each module of mgbench_analysis and the package's modules it imports, at module level or inside
    a function (a lazy import hides a cycle from Python, not from this graph)."""
    import ast
    package = Path(mga.__file__).resolve().parent
    names = {p.stem for p in package.glob("*.py")}
    graph = {}
    for path in package.glob("*.py"):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    imported.add(node.module.split(".")[0])
                else:  # from . import a, b
                    imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mgbench_analysis."):
                imported.add(node.module.split(".")[1])
        graph[path.stem] = {m for m in imported if m in names and m != path.stem}
    return graph


def test_the_package_has_no_import_cycle():
    graph = _package_imports()
    assert "attributes" in graph["report"] and "attributes" in graph["workload"]  # the graph sees imports
    # Depth-first search for a back edge; the cycle named if found.
    state, stack = {}, []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for dependency in sorted(graph[module]):
            if state.get(dependency) == "open":
                cycle = stack[stack.index(dependency):] + [dependency]
                pytest.fail("import cycle in mgbench_analysis: " + " -> ".join(cycle))
            if dependency not in state:
                visit(dependency)
        stack.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_phase_breakdown_puts_runs_of_any_length_on_one_axis():
    """Per optimizer step (issue 50): a 10-epoch run and a 1-epoch run of the same steps draw bars of
    the same length (in seconds, the 1-epoch bars were a tenth of the other and unreadable)."""
    fig = figs.draw("phase_breakdown", figs.Data([synthetic_run("long", epochs=10), synthetic_run("short", epochs=1)]))
    (ax,) = fig.axes
    totals = np.zeros(2)
    for container in ax.containers:
        totals += [p.get_width() for p in container.patches]
    # Each step 0.5 s of train_s (synthetic_run), every phase and "other" included: 500 ms a step.
    assert totals == pytest.approx([500.0, 500.0]), totals
    assert ax.get_xlabel() == "time per optimizer step, mean over ranks (ms)"


def test_phase_breakdown_leaves_out_the_steps_of_an_epoch_without_its_record():
    """A preempted (or diverged) run keeps its unfinished epoch's steps but writes no epoch row for it:
    the phases summed over the epoch rows are per step of those epochs (with the extra steps counted,
    a stopped run's bars were short by their share)."""
    stopped = synthetic_run("stopped", epochs=2)
    for r, frame in enumerate(stopped.steps):
        extra = [dict(epoch=2, step=k, start_s=20.0 + 0.5 * k, step_s=0.45) for k in range(3)]
        stopped.steps[r] = pd.concat([frame, pd.DataFrame(extra)], ignore_index=True)
    fig = figs.draw("phase_breakdown", figs.Data([stopped]))
    (ax,) = fig.axes
    total = sum(container.patches[0].get_width() for container in ax.containers)
    assert total == pytest.approx(500.0), total
