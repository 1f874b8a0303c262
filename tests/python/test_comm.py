"""`mgbench comm` (nccl-tests-style collective benchmark) and `mgbench predict` end to end, on the CPU
over MPI: the table's layout and values against the results file (h5py), the correctness check
failing when a rank perturbs its input, predictions written as runs and shown beside measured ones."""
import math
import re

import numpy as np
import pytest

from conftest import MNIST, mgbench

h5py = pytest.importorskip("h5py")

COLLECTIVES = ["all-reduce", "all-gather", "reduce-scatter", "broadcast"]


def data_rows(stdout):
    return [line.split() for line in stdout.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("np_", [2, 3])
def test_table_has_nccl_tests_layout_and_equals_the_results_file(tmp_path, np_):
    results = tmp_path / "comm.h5"
    proc = mgbench("comm", "--collective", "all", "--min-bytes", "8", "--max-bytes", "64K", "--step-factor", "16",
                   "--iters", "5", "--warmup-iters", "2", "--dtype", "bf16", "--results", results, np=np_, check=True)
    out = proc.stdout
    assert "# Out of bounds values : 0 OK" in out
    assert re.search(r"^#\s+\(B\)\s+\(elements\)\s+\(us\)", out, re.M), out  # the units row
    rows = data_rows(out)
    assert len(rows) == 4 * 4  # 4 collectives x sizes 8, 128, 2K, 32K
    with h5py.File(results, "r") as f:
        (run,) = f["runs"].values()
        assert run["status"][0] == b"completed" and run.attrs["task"] == "comm" and run.attrs["backend"] == "mpi"
        assert run.attrs["world_size"] == np_ and run.attrs["dtype"] == "bf16"
        tables = [run[f"rank_{r}/comm"][:] for r in range(np_)]
    factors = {"all-reduce": 2 * (np_ - 1) / np_, "all-gather": (np_ - 1) / np_, "reduce-scatter": (np_ - 1) / np_,
               "broadcast": 1.0}
    for i, row in enumerate(rows):
        size, count = int(row[0]), int(row[1])
        out_place = [t[2 * i] for t in tables]
        in_place = [t[2 * i + 1] for t in tables]
        collective = out_place[0]["collective"].decode()
        assert collective == COLLECTIVES[i // 4]
        assert out_place[0]["bytes"] == size and out_place[0]["count"] == count and in_place[0]["in_place"] == 1
        if collective in ("all-gather", "reduce-scatter"):
            assert size == count * np_ * 2  # bf16: the whole message, a multiple of the ranks
        # time min / avg / max across ranks, algbw from the average, busbw with nccl-tests' factor.
        for half, offset in ((out_place, 5), (in_place, 11)):
            times = np.array([t["time_s"] for t in half]) * 1e6
            t_min, t_avg, t_max, algbw, busbw, wrong = row[offset:offset + 6]
            assert math.isclose(float(t_min), times.min(), abs_tol=0.006)
            assert math.isclose(float(t_avg), times.mean(), abs_tol=0.006)
            assert math.isclose(float(t_max), times.max(), abs_tol=0.006)
            assert math.isclose(float(algbw), size / times.mean() / 1e3, abs_tol=0.006)
            assert math.isclose(float(busbw), size / times.mean() / 1e3 * factors[collective], abs_tol=0.006)
            assert wrong == "0" and all(t["wrong"] == 0 for t in half)
    # `mgbench report` shows the same rows from the file.
    report = mgbench("report", "--csv", results, check=True).stdout.splitlines()
    assert report[0].startswith("file,run_id,status,ranks,backend,device,collective")
    assert len(report) == 1 + 2 * len(rows)
    # Its bandwidths as exact as its times (were 4 decimals: an 8-byte message's GB/s read 0.0004 or 0).
    import csv
    for line in csv.DictReader(report):
        size, mean = int(line["bytes"]), float(line["time_avg_s"])
        assert math.isclose(float(line["algbw_gbs"]), size / mean / 1e9, rel_tol=1e-6), line


def test_sizes_below_a_collectives_granularity_are_measured_once(tmp_path):
    """1, 2 and 4 bytes of fp32 are one 4-byte message (all-gather and reduce-scatter: 8 bytes at 2
    ranks): one row each (was: three rows of 4 bytes, on screen and in the file)."""
    results = tmp_path / "c.h5"
    mgbench("comm", "--collective", "all-reduce,reduce-scatter", "--min-bytes", "1", "--max-bytes", "64", "--iters", "2",
            "--warmup-iters", "1", "--results", results, np=2, check=True)
    with h5py.File(results, "r") as f:
        (run,) = f["runs"].values()
        rows = run["rank_0"]["comm"][:]
    rows = rows[rows["bytes"] > 0]
    measured = {c: [int(b) for b, p, name in zip(rows["bytes"], rows["in_place"], rows["collective"])
                    if name.decode() == c and p == 0] for c in ("all-reduce", "reduce-scatter")}
    assert measured == {"all-reduce": [4, 8, 16, 32, 64], "reduce-scatter": [8, 16, 32, 64]}, measured


def test_a_perturbed_rank_fails_the_check(tmp_path):
    results = tmp_path / "comm.h5"
    proc = mgbench("comm", "--collective", "all-reduce,all-gather", "--min-bytes", "64", "--max-bytes", "64",
                   "--iters", "2", "--check-perturb-rank", "1", "--results", results, np=2)
    assert proc.returncode == 1, proc.stderr
    rows = data_rows(proc.stdout)
    # One element of rank 1's input is off: every rank's all-reduce sees it at element 0 (2 ranks x
    # 2 placements), the all-gather at rank 1's first element.
    assert [r[10] for r in rows] == ["2", "2"] and [r[16] for r in rows] == ["2", "2"], proc.stdout
    assert re.search(r"# Out of bounds values : 8 FAILED", proc.stdout), proc.stdout
    with h5py.File(results, "r") as f:
        (run,) = f["runs"].values()
        assert run["status"][0] == b"failed" and b"8 wrong value" in run["error"][0]


@pytest.mark.parametrize("op", ["max", "min"])
def test_a_perturbed_rank_fails_the_check_of_max_and_min(tmp_path, op):
    # Rank 0's element 0 becomes 100 (max) or -100 (min): outside the pattern, so the reduction keeps it.
    proc = mgbench("comm", "--collective", "all-reduce,reduce-scatter", "--op", op, "--min-bytes", "64",
                   "--max-bytes", "64", "--iters", "1", "--check-perturb-rank", "0", "--results", tmp_path / "c.h5",
                   np=2)
    assert proc.returncode == 1 and "FAILED" in proc.stdout, proc.stdout
    all_reduce, reduce_scatter = data_rows(proc.stdout)
    assert all_reduce[10] == "2" and reduce_scatter[10] == "1"  # every rank; rank 0's slice only


def test_perturbing_a_broadcast_non_root_is_refused(tmp_path):
    proc = mgbench("comm", "--collective", "broadcast", "--check-perturb-rank", "1", "--results", tmp_path / "c.h5",
                   np=2)
    assert proc.returncode == 2 and "only the root's input (0) is read" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, needle", [
    (["--collective", "all-to-all"], "--collective 'all-to-all': expected all-reduce"),
    (["--max-bytes", "12Q"], "--max-bytes '12Q': expected a size in bytes"),
    (["--max-bytes", "99999999999999999999"], "--max-bytes '99999999999999999999': expected a size of at most "),
    (["--min-bytes", "1M", "--max-bytes", "1K"], "--max-bytes 1K is below --min-bytes 1M"),
    (["--dtype", "int8"], "--dtype 'int8': expected fp32, bf16, fp16 or fp64"),
    (["--iters", "0"], "--iters"),
    # each launch's handle is kept until the wait: 10^12 launches ended in bad_alloc
    (["--iters", "1000000000000"], "--iters '1000000000000': expected <= 1000000"),
    (["--warmup-iters", "1000000000000"], "--warmup-iters '1000000000000': expected <= 1000000"),
    # beyond this rank's memory: was the allocator's error (or the kernel's OOM killer) in the first case
    (["--collective", "all-reduce,all-gather", "--min-bytes", "4096G", "--max-bytes", "4096G", "--device", "cpu"],
     "--max-bytes 4096G: its largest case (all-reduce at 2 ranks) holds about 37888.0 GiB per rank"),
    # Options of other collectives, or of the check, where they have no effect (were ignored).
    (["--collective", "all-gather", "--op", "max"], "--op 'max': only with --collective all-reduce, reduce-scatter or"),
    (["--root", "1"], "--root '1': only with --collective broadcast or all"),
    (["--check", "false", "--check-perturb-rank", "1"], "--check-perturb-rank '1': only with --check true"),
])
def test_bad_options_are_named(tmp_path, args, needle):
    proc = mgbench("comm", *args, "--results", tmp_path / "r.h5", np=2)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert not (tmp_path / "r.h5").exists()


def test_root_outside_the_world_is_refused(tmp_path):
    proc = mgbench("comm", "--collective", "broadcast", "--root", "5", "--results", tmp_path / "r.h5", np=2)
    assert proc.returncode == 2 and "--root 5" in proc.stderr and "below 2" in proc.stderr


def test_predict_writes_prediction_runs_that_report_compares(tmp_path):
    if not (MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"no MNIST at {MNIST}")
    image = ["image", "--data", MNIST, "--limit-train", "256", "--limit-test", "128", "--epochs", "1",
             "--batch-size", "32", "--width-mult", "0.25", "--image-size", "32", "--threads", "1", "--device", "cpu",
             "--progress-interval", "1000"]
    one, two, comm = tmp_path / "one.h5", tmp_path / "two.h5", tmp_path / "comm.h5"
    mgbench(*image, "--results", one, np=1, check=True)
    mgbench(*image, "--results", two, np=2, check=True)
    mgbench("comm", "--min-bytes", "1K", "--max-bytes", "4M", "--step-factor", "4", "--iters", "3",
            "--results", comm, np=2, check=True)
    predictions = tmp_path / "pred.h5"
    proc = mgbench("predict", one, "--comm", comm, "--ranks", "1,2,4", "--strategies", "ddp-ds,ddp",
                   "--results", predictions, check=True)
    assert ("4 ranks skipped: no all-reduce measured at 4 ranks (mpirun -np 4 mgbench comm --collective all-reduce)"
            in proc.stdout), proc.stdout
    table = data_rows(proc.stdout)
    assert [(r[0], r[1], r[2]) for r in table] == [("1", "1", "ddp-ds"), ("2", "1", "ddp-ds"), ("1", "1", "ddp"),
                                                   ("2", "1", "ddp")]  # ranks, nodes, strategy
    with h5py.File(one, "r") as f:
        (measured,) = f["runs"].values()
        measured_total, measured_id = measured["summary"][0]["total_s"], measured.attrs["run_id"]
        steps_one = int(measured["rank_0/epochs"][0]["steps"])
    with h5py.File(predictions, "r") as f:
        runs = {r.attrs["strategy"] + "-" + str(r.attrs["world_size"]): r for r in f["runs"].values()}
        assert set(runs) == {"ddp-ds-1", "ddp-ds-2", "ddp-1", "ddp-2"}
        for run in runs.values():
            assert run.attrs["task"] == "prediction" and run.attrs["predicted_task"] == "image"
            assert run.attrs["prediction_of"] == measured_id and run.attrs["prediction_of_file"] == str(one)
        # At 1 rank the model returns its measurement; ddp-ds halves the steps, ddp keeps them.
        assert math.isclose(runs["ddp-ds-1"]["summary"][0]["total_s"], measured_total, rel_tol=1e-9)
        assert runs["ddp-ds-2"].attrs["prediction_steps_per_epoch"] == math.ceil(steps_one / 2)
        assert runs["ddp-2"].attrs["prediction_steps_per_epoch"] == steps_one
        assert runs["ddp-ds-2"].attrs["prediction_comm"].startswith("comm run")
        predicted_two = runs["ddp-ds-2"]["summary"][0]["total_s"]
    with h5py.File(two, "r") as f:
        (run,) = f["runs"].values()
        measured_two, measured_two_id = run["summary"][0]["total_s"], run.attrs["run_id"]
    report = mgbench("report", one, two, predictions, check=True).stdout
    line = next(l for l in report.splitlines() if "predicted-ddp-ds-2r" in l)
    error = float(line.split()[-1])  # the last column
    assert measured_two_id in line
    assert math.isclose(error, 100 * (predicted_two - measured_two) / measured_two, abs_tol=0.051)
    # Predictions never become baselines: the image table's 2-rank row keeps its measured peer.
    image_rows = [l for l in report.splitlines() if l.startswith("  ") and "completed" in l]
    assert len(image_rows) == 2
    # Nor references, runs judged or repeats (were: "holds", exit 0; a repeats group), said in a note, on
    # stderr with --csv; alike in mgbench_analysis.
    import shutil
    import mgbench_analysis as mga
    reference = shutil.copy(two, tmp_path / "reference.h5")
    check = mgbench("report", "--reference", reference, "--csv", two, predictions)
    assert check.returncode == 0 and "# 4 predicted run(s) (mgbench predict) left out" in check.stderr, check.stderr
    assert {line.split(",")[0] for line in check.stdout.splitlines()[1:]} == {measured_two_id}, check.stdout
    frame = mga.compare(reference, [two, predictions])
    assert set(frame["run_id"]) == {measured_two_id} and mga.exit_status(frame) == 0
    assert mga.exit_status(mga.compare(reference, predictions)) == 2  # nothing compared, as the report's exit 2
    assert mgbench("report", "--reference", reference, predictions).returncode == 2
    predicted = mga.read(predictions)
    assert len(mga.repeats(mga.read(two) * 2)) > 0 and mga.repeats(predicted * 2).empty  # each run twice


def test_predict_reads_the_steps_a_rank_wrote_of_a_table_far_larger(tmp_path, mnist):
    """The predictor reads every rank's steps (the per-step straggler wait) up to the rows written: a
    steps table of 10^12 zero rows (a damaged file, or one another tool rewrote; 40 TB if read whole)
    is read to its first block and the prediction made, where reading it whole died of bad_alloc."""
    image = ["image", "--data", mnist, "--limit-train", "128", "--limit-test", "32", "--epochs", "1", "--batch-size",
             "32", "--width-mult", "0.25", "--image-size", "32", "--threads", "1", "--device", "cpu",
             "--progress-interval", "1000"]
    one, two = tmp_path / "one.h5", tmp_path / "two.h5"
    mgbench(*image, "--results", one, np=1, check=True)
    mgbench(*image, "--results", two, np=2, check=True)
    with h5py.File(two, "r+") as f:
        (run,) = f["runs"].values()
        dtype = run["rank_1/steps"].dtype
        del run["rank_1/steps"]
        run.create_dataset("rank_1/steps", shape=(10**12,), maxshape=(None,), chunks=(1024,), dtype=dtype)
    proc = mgbench("predict", one, two, "--ranks", "4", "--link", "h100-nvlink", "--results", tmp_path / "p.h5",
                   timeout=120, check=True)
    assert "4 ranks on 1 node(s): overlap" in proc.stdout, proc.stdout  # learnt from the 2-rank run
    mgbench("report", one, two, timeout=120, check=True)


def rewrite_far_larger(path, tables):
    """Each table at `tables` (paths inside the file's one run) of the results file at `path` rewritten as
    another tool might: chunked, its extent 10^12 rows, holding the rows it held (the rest its fill)."""
    with h5py.File(path, "r+") as f:
        (run,) = f["runs"].values()
        for name in tables:
            old = run[name]
            data, attrs, fill = old[()], dict(old.attrs), old.fillvalue
            del run[name]
            tail = data.shape[1:]
            new = run.create_dataset(name, shape=(10**12, *tail), maxshape=(None, *tail), chunks=(1024, *tail),
                                     dtype=data.dtype, fillvalue=fill)
            new[:len(data)] = data
            new.attrs.update(attrs)


def test_report_and_predict_read_every_table_to_the_rows_its_file_stores(tmp_path, mnist):
    """Every table mgbench reads (the run's summary; a rank's steps, epochs, energy, telemetry, comm) is
    read in blocks up to the rows written and stored, whatever its extent: with rank 1's tables claiming
    10^12 rows (hundreds of terabytes if read as claimed: every table but steps was read whole, and died
    of bad_alloc) report and predict print what they printed before."""
    image = ["image", "--data", mnist, "--limit-train", "128", "--limit-test", "32", "--epochs", "2", "--batch-size",
             "32", "--width-mult", "0.25", "--image-size", "32", "--threads", "1", "--device", "cpu",
             "--progress-interval", "1000"]
    one, two, comm = tmp_path / "one.h5", tmp_path / "two.h5", tmp_path / "comm.h5"
    mgbench(*image, "--results", one, np=1, check=True)
    mgbench(*image, "--results", two, np=2, check=True)
    mgbench("comm", "--max-bytes", "4K", "--iters", "2", "--results", comm, np=2, check=True)
    predictions = tmp_path / "predictions.h5"
    predict = ["predict", one, two, "--ranks", "4", "--link", "h100-nvlink", "--results", predictions]
    before = [mgbench("report", one, two, comm, check=True).stdout, mgbench(*predict, check=True).stdout]
    predictions.unlink()
    with h5py.File(two, "r") as f:
        (run,) = f["runs"].values()
        tables = ["summary", *(f"rank_1/{name}" for name in run["rank_1"])]
    assert {"summary", "rank_1/steps", "rank_1/epochs", "rank_1/energy", "rank_1/telemetry"} <= set(tables)
    rewrite_far_larger(two, tables)
    rewrite_far_larger(comm, ["summary", "rank_1/comm"])
    after = [mgbench("report", one, two, comm, timeout=120, check=True).stdout,
             mgbench(*predict, timeout=120, check=True).stdout]
    assert after == before


def test_predict_without_a_one_rank_run_says_so(tmp_path):
    comm = tmp_path / "comm.h5"
    mgbench("comm", "--max-bytes", "1K", "--iters", "1", "--results", comm, np=2, check=True)
    proc = mgbench("predict", comm, "--results", tmp_path / "p.h5")
    assert proc.returncode == 1 and "no completed 1-rank run" in proc.stderr
    proc = mgbench("predict", comm, "--ranks", "0,2")
    assert proc.returncode == 2 and "--ranks '0,2': expected" in proc.stderr
    proc = mgbench("predict", comm, "--link", "infiniband")
    assert proc.returncode == 2 and "--link 'infiniband'" in proc.stderr
    # Were accepted: no strategy ("nothing predicted"), one twice (identical predictions written twice),
    # and nodes overflowing to -1.
    for args, needle in ((["--strategies", ""], "--strategies '': expected comma-separated strategies, each once"),
                         (["--strategies", "ddp,ddp"], "--strategies 'ddp,ddp': expected"),
                         (["--ranks-per-node", "9223372036854775807"], "--ranks-per-node '9223372036854775807': "
                                                                      "expected <= 1048576")):
        proc = mgbench("predict", comm, *args)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
