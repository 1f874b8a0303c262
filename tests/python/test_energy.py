"""Energy per rank (--telemetry, profile/telemetry.h) end to end on the CPU: a stand-in powercap tree
(MGBENCH_POWERCAP_ROOT) whose RAPL counter a thread advances -- through its wrap, while the run is
held mid-training -- as two ranks train; the results file's energy tables read with h5py, `mgbench report --energy` and
mgbench_analysis.energy checked against them; the refusals and the "no energy counter" record."""
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import h5py
import pytest

from conftest import BIN, ENV, MPIEXEC, SMALL, start, wait_for, wait_for_hold

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import mgbench_analysis as mga  # noqa: E402

WRAP_UJ = 2**32  # max_energy_range_uj + 1 of the stand-in package
STEP_UJ = 20_000  # what the advancing thread adds each time [µJ]


def run(*args, np=2, env=None):
    cmd = [MPIEXEC, "-np", str(np), "--oversubscribe", BIN, *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(ENV, **(env or {})))


def image_args(mnist, results, *extra, limit_train=64):
    return ["image", "--data", mnist, *SMALL, "--limit-train", str(limit_train), "--limit-test", "16", "--batch-size", "8", "--epochs", "1",
            "--results", results, *extra]


class AdvancingCounter:
    """A RAPL package (intel-rapl:0) whose energy_uj grows by STEP_UJ every few milliseconds, replaced
    atomically (rename) so that a reader never sees half a number. Where `release` (an Event) is given,
    it holds BEFORE_WRAP_UJ below its wrap until the event is set (the test sets it while the run is
    held mid-training, so that the ranks' first reading is before the wrap and their last after it,
    however fast the machine trains); else it advances from the start."""

    BEFORE_WRAP_UJ = 100 * STEP_UJ

    def __init__(self, root: Path, release: threading.Event = None):
        self.release = release
        self.wrapped = False
        self.package = root / "intel-rapl:0"
        self.package.mkdir(parents=True)
        (self.package / "max_energy_range_uj").write_text(f"{WRAP_UJ - 1}\n")
        (self.package / "name").write_text("package-0\n")
        self.value = WRAP_UJ - self.BEFORE_WRAP_UJ
        self.written_uj = 0
        self._write()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._advance)

    def _write(self):
        tmp = self.package / "energy_uj.tmp"
        tmp.write_text(f"{self.value}\n")
        os.replace(tmp, self.package / "energy_uj")

    def _advance(self):
        while not self.stop.wait(0.005):
            if self.release is not None and not self.release.is_set():
                continue
            self.wrapped |= self.value + STEP_UJ >= WRAP_UJ
            self.value = (self.value + STEP_UJ) % WRAP_UJ
            self.written_uj += STEP_UJ
            self._write()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def test_rapl_energy_per_sample_over_two_ranks_of_one_node(tmp_path, mnist):
    results = tmp_path / "r.h5"
    root = tmp_path / "powercap"
    # Rank 0 stops itself once it has committed step 16's checkpoint (of 64 steps); the counter then
    # wraps, and the rank goes on.
    with AdvancingCounter(root, release=threading.Event()) as counter:
        proc = start(image_args(mnist, results, "--telemetry", "rapl", "--telemetry-interval", "20", "--checkpoint-dir",
                                tmp_path / "ck", "--checkpoint-every", "16", limit_train=1024),
                     hold_at=16, env={"MGBENCH_POWERCAP_ROOT": str(root)})
        held = wait_for_hold(proc, 16)
        counter.release.set()
        wait_for(lambda: counter.wrapped, proc, timeout=60, what="the counter's wrap")
        os.kill(held, signal.SIGCONT)
        _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    with h5py.File(results, "r") as f:
        (run_id,) = f["runs"].keys()
        ranks = [f["runs"][run_id][f"rank_{r}"] for r in (0, 1)]
        rows = [rank["energy"][0] for rank in ranks]
        readings = [rank["telemetry"][:] for rank in ranks]
    total_j = 0.0
    for row, table in zip(rows, readings):
        assert row["source"] == b"rapl" and row["node_share"] == 0.5  # two ranks share the node's package
        assert row["samples"] == 512 and row["tokens"] == 0  # 1024 images over 2 ranks, one epoch
        # The wrap undone: the counter's difference is what the thread added between the first reading
        # (before the release) and the last (after the wrap) -- at least what it took to wrap, never
        # more than all it added -- and the readings never fall.
        assert counter.BEFORE_WRAP_UJ / 1e6 <= row["energy_j"] <= counter.written_uj / 1e6
        written = table[~(table["t_s"] != table["t_s"])]  # NaN rows: unwritten
        assert len(written) == row["readings"] >= 2
        assert all(b >= a for a, b in zip(written["energy_j"], written["energy_j"][1:]))
        assert written["energy_j"][-1] == pytest.approx(row["energy_j"])
        assert row["span_s"] == pytest.approx(written["t_s"][-1])
        assert row["mean_power_w"] == pytest.approx(row["energy_j"] / row["span_s"])
        assert row["throttled_s"] != row["throttled_s"]  # RAPL has no slowdown reasons: NaN
        total_j += row["energy_j"] * row["node_share"]
    # The report's J/sample: the node's energy once, over both ranks' samples.
    proc = subprocess.run([BIN, "report", "--energy", "--csv", results], capture_output=True, text=True, env=ENV)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    # Keyed as the other tables (file, run_id), a value not recorded "-" as theirs (was "nan").
    header = lines.index(next(l for l in lines if l.startswith("file,run_id,ranks,source")))
    fields = dict(zip(lines[header].split(","), lines[header + 1].split(",")))
    assert fields["file"] == str(results) and fields["run_id"] == run_id, fields
    assert fields["source"] == "rapl" and fields["ranks"] == "2" and fields["throttled_pct"] == "-", fields
    assert float(fields["energy_j"]) == pytest.approx(total_j, rel=1e-5)
    assert float(fields["j_per_sample"]) == pytest.approx(total_j / 1024, rel=1e-5)
    # mgbench_analysis reads the same rows.
    frame = mga.energy(str(results))
    assert list(frame["rank"]) == [0, 1] and list(frame["source"]) == ["rapl", "rapl"]
    assert (frame["energy_j"] * frame["node_share"]).sum() == pytest.approx(total_j)
    assert len(mga.energy(str(results), "telemetry")) == sum(int(r["readings"]) for r in rows)


def test_a_node_without_a_counter_records_none_and_the_report_says_so(tmp_path, mnist):
    results = tmp_path / "r.h5"
    empty = tmp_path / "powercap"
    empty.mkdir()
    proc = run(*image_args(mnist, results), np=1, env={"MGBENCH_POWERCAP_ROOT": str(empty)})  # --telemetry auto
    assert proc.returncode == 0, proc.stderr
    assert "no energy counter" in proc.stderr and "no RAPL package domain" in proc.stderr
    with h5py.File(results, "r") as f:
        (run_id,) = f["runs"].keys()
        row = f["runs"][run_id]["rank_0"]["energy"][0]
        assert row["source"] == b"none" and row["readings"] == 0 and row["energy_j"] != row["energy_j"]
    proc = subprocess.run([BIN, "report", "--energy", results], capture_output=True, text=True, env=ENV)
    assert proc.returncode == 0, proc.stderr
    assert f"# {run_id}: no energy counter" in proc.stdout


def test_telemetry_off_writes_no_energy_table(tmp_path, mnist):
    results = tmp_path / "r.h5"
    proc = run(*image_args(mnist, results, "--telemetry", "off"), np=1)
    assert proc.returncode == 0, proc.stderr
    with h5py.File(results, "r") as f:
        (run_id,) = f["runs"].keys()
        assert "energy" not in f["runs"][run_id]["rank_0"]
    proc = subprocess.run([BIN, "report", "--energy", results], capture_output=True, text=True, env=ENV)
    assert f"# no energy recorded (--telemetry off, or written before schema 9): {run_id}" in proc.stdout


@pytest.mark.parametrize("request_, expected", [
    ("nvml", "--telemetry nvml: this rank computes on the CPU"),
    ("rapl", "--telemetry rapl: "),
])
def test_a_source_asked_for_by_name_that_cannot_be_read_is_refused(tmp_path, mnist, request_, expected):
    results = tmp_path / "r.h5"
    empty = tmp_path / "powercap"
    empty.mkdir()
    proc = run(*image_args(mnist, results, "--telemetry", request_), np=1, env={"MGBENCH_POWERCAP_ROOT": str(empty)})
    assert proc.returncode != 0
    assert expected in proc.stderr
    assert not results.exists()  # refused at set-up, before the results file
