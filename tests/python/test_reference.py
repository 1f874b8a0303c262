"""`mgbench report --reference` and `mgbench_analysis.compare` on real runs (issue 29): a reference of
two repeats; a run of the same configuration, which holds; one made slower by how it ran -- its one
core shared with three busy loops, a quarter of it -- which regresses; and bad input, exit 2. The
table, the exit status and the frame agree."""
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest

from conftest import BIN, ENV, SMALL, mgbench

pd = pytest.importorskip("pandas")
pytest.importorskip("h5py")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import mgbench_analysis as mga  # noqa: E402

CORE = "1"  # every run on the same core, so the busy loops below share it


def run_image(mnist, results, name):
    cmd = ["taskset", "-c", CORE, BIN, "image", "--data", mnist, *SMALL, "--limit-train", "512", "--limit-test", "64",
           "--epochs", "1", "--batch-size", "32", "--results", results, "--run-name", name]
    proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=600, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]


def table_rows(stdout):
    return [line.split() for line in stdout.splitlines() if line.startswith("  ")]


def test_a_slower_configuration_regresses_and_the_same_one_holds(tmp_path, mnist):
    reference, same, slow = tmp_path / "reference.h5", tmp_path / "same.h5", tmp_path / "slow.h5"
    for i in range(2):
        run_image(mnist, reference, f"reference-{i}")
    run_image(mnist, same, "same")
    busy = [subprocess.Popen(["taskset", "-c", CORE, sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        run_image(mnist, slow, "slow")
    finally:
        for p in busy:
            p.kill()
            p.wait()
    # A generous tolerance: CI shares this machine's two cores; the busy loops cost about 4x.
    holds = mgbench("report", "--reference", reference, "--tolerance", "50", same)
    assert holds.returncode == 0, holds.stdout + holds.stderr
    rows = table_rows(holds.stdout)
    assert [r[4] for r in rows] == ["img/s", "s/epoch", "peak_MiB"] and all(r[-1] == "holds" for r in rows), holds.stdout
    assert all(r[-2] == "2/1" for r in rows)  # the median of two reference repeats, one run
    assert holds.stdout.rstrip().endswith("PASS")
    regressed = mgbench("report", "--reference", reference, "--tolerance", "50", slow)
    assert regressed.returncode == 1, regressed.stdout + regressed.stderr
    verdicts = {r[4]: r[-1] for r in table_rows(regressed.stdout)}
    assert verdicts["img/s"] == "REGRESSED" and verdicts["s/epoch"] == "REGRESSED", regressed.stdout
    assert regressed.stdout.rstrip().endswith("FAIL")
    # The frame: the report's CSV, and the same verdicts.
    csv = pd.read_csv(StringIO(mgbench("report", "--reference", reference, "--tolerance", "50", "--csv", slow).stdout),
                      dtype=str, keep_default_na=False)
    frame = mga.compare(reference, slow, tolerance=0.5)
    assert list(frame.columns) == list(csv.columns) and len(frame) == len(csv) == 3
    assert list(frame["verdict"]) == list(csv["verdict"]) and not mga.passed(frame)
    for column in ("reference", "measured", "ratio"):
        assert (abs(frame[column] - csv[column].astype(float)) <= 1e-5 * frame[column].abs() + 1e-6).all(), column
    assert mga.passed(mga.compare(reference, same, tolerance=0.5))


def test_bad_input_and_nothing_to_compare_exit_2(tmp_path, mnist):
    run = tmp_path / "run.h5"
    run_image(mnist, run, "one")
    missing = mgbench("report", "--reference", tmp_path / "missing.h5", run)
    assert missing.returncode == 2 and "missing.h5" in missing.stderr
    other = tmp_path / "other.h5"
    cmd = [BIN, "image", "--data", mnist, *SMALL, "--limit-train", "256", "--limit-test", "64", "--epochs", "1",
           "--batch-size", "16", "--results", other]
    assert subprocess.run(list(map(str, cmd)), capture_output=True, env=ENV, timeout=600).returncode == 0
    nothing = mgbench("report", "--reference", other, run)
    assert nothing.returncode == 2, nothing.stdout + nothing.stderr
    assert "nothing to compare" in nothing.stderr and "differs in" in nothing.stderr
    assert mgbench("report", "--reference", other, "--tolerance", "0", run).returncode == 2


def test_repeat_runs_the_job_n_times_and_the_report_gives_their_spread(tmp_path, mnist):
    results = tmp_path / "repeat.h5"
    proc = mgbench("image", "--data", mnist, *SMALL, "--limit-train", "256", "--limit-test", "64", "--epochs", "1",
                   "--batch-size", "32", "--results", results, "--repeat", "3", "--run-name", "nightly", np=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = mga.read(results)
    assert [r.run_id.split("_", 1)[1] for r in runs] == ["nightly-r0", "nightly-r1", "nightly-r2"]
    assert [r.attributes["repeat_index"] for r in runs] == [0, 1, 2] and {r.attributes["repeat"] for r in runs} == {3}
    assert len({r.attributes["config_id"] for r in runs}) == 1 and all(r.status == "completed" for r in runs)
    # The same seed each time: the same model, data order and so the same losses.
    assert len({round(r.summary["final_loss"], 6) for r in runs}) == 1
    blocks = mgbench("report", "--csv", results, check=True).stdout.strip().split("\n\n")
    spread = pd.read_csv(StringIO(blocks[-1]), dtype=str, keep_default_na=False)
    frame = mga.repeats(results)
    assert list(spread.columns) == list(frame.columns) == mga.reference.REPEAT_COLUMNS
    assert list(spread["metric"]) == list(frame["metric"]) == ["img/s", "s/epoch", "peak_MiB"]
    assert (spread["runs"] == "3").all() and (frame["runs"] == 3).all()
    imgs = sorted(r.summary["samples_per_s"] for r in runs)
    row = frame[frame["metric"] == "img/s"].iloc[0]
    assert (row["min"], row["median"], row["max"]) == pytest.approx((imgs[0], imgs[1], imgs[2]))
    assert abs(float(spread[spread["metric"] == "img/s"]["median"].iloc[0]) - imgs[1]) <= 1e-5 * imgs[1]
    refused = mgbench("image", "--data", mnist, *SMALL, "--repeat", "2", "--checkpoint-dir", tmp_path / "ck")
    assert refused.returncode == 2 and "--repeat 2 with --checkpoint-dir" in refused.stderr
