"""Several nodes, simulated (issue 30): network namespaces as nodes (tests/cluster/cluster.sh: own
host names and addresses, Open MPI over TCP through an rsh agent, one shared file system). Jobs across
2 nodes x 1 rank give results bitwise equal to 2 ranks on one node (CPU, fp32: the same per-step
losses on every rank), and each rank knows its node: host name, local rank, the node's thread share.

Skipped, with the reason, where the namespaces cannot be made (not root)."""
import os
import re
import signal
import time
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import BIN, ENV, MPIEXEC, SHARED, SMALL

h5py = pytest.importorskip("h5py")
np = pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "tests" / "cluster" / "cluster.sh"
MNIST = SHARED / "mnist"
MODEL = Path(os.environ.get("MGBENCH_ORACLE_DIR", "")) / "llama_tiny_2256"
TOKENIZER = SHARED / "llama3" / "tiktoken_small.model"
ALPACA = SHARED / "text" / "alpaca" / "alpaca_cleaned_first5k.json"


@pytest.fixture(scope="module")
def cluster():
    if not (MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"no MNIST at {MNIST}")
    d = Path(tempfile.mkdtemp(prefix="mgbench-cluster-"))
    started = subprocess.run([str(CLUSTER), "start", str(d), "2"], capture_output=True, text=True)
    try:
        if started.returncode == 77:
            pytest.skip(started.stderr.strip().splitlines()[-1])
        assert started.returncode == 0, started.stdout + started.stderr
        yield d
    finally:
        subprocess.run([str(CLUSTER), "stop", str(d)])
        shutil.rmtree(d, ignore_errors=True)


def on_two_nodes(cluster, *args):
    """mgbench ARGS on node1 and node2, one rank each, over the simulated network."""
    cmd = [str(cluster / "mpirun"), "-np", "2", "--hostfile", str(cluster / "hostfile"), "--bind-to", "none", BIN,
           *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def on_one_node(*args):
    cmd = [MPIEXEC, "-np", "2", "--oversubscribe", "--bind-to", "none", BIN, *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def last_run(path):
    f = h5py.File(path, "r")
    return f, list(f["runs"].values())[-1]


def assert_same_steps(a_path, b_path):
    fa, a = last_run(a_path)
    fb, b = last_run(b_path)
    with fa, fb:
        for r in range(2):
            la, lb = a[f"rank_{r}/steps"]["loss"], b[f"rank_{r}/steps"]["loss"]
            written = a[f"rank_{r}/steps"]["epoch"] >= 0
            assert written.sum() > 0 and np.array_equal(la[written], lb[written]), f"rank {r}: losses differ"
        assert a["summary"][0]["final_loss"] == b["summary"][0]["final_loss"]


def assert_ranks_on_their_nodes(path, threads):
    f, run = last_run(path)
    with f:
        assert run.attrs["hosts"] == "node1,node2" and run.attrs["nodes"] == 2
        for r in range(2):
            attrs = run[f"rank_{r}"].attrs
            assert attrs["hostname"] == f"node{r + 1}" and attrs["local_rank"] == 0, dict(attrs)
            assert attrs["threads"] == threads, (r, dict(attrs))


def test_image_across_two_nodes_equals_one_node(cluster, tmp_path):
    args = ["image", "--data", MNIST, *SMALL, "--limit-train", "256", "--limit-test", "64", "--epochs", "2",
            "--batch-size", "32"]
    on_two_nodes(cluster, *args, "--results", tmp_path / "nodes.h5")
    on_one_node(*args, "--results", tmp_path / "node.h5")
    assert_same_steps(tmp_path / "nodes.h5", tmp_path / "node.h5")
    assert_ranks_on_their_nodes(tmp_path / "nodes.h5", threads=1)


def test_each_rank_takes_its_nodes_share_of_the_cores(cluster, tmp_path):
    """--threads 0: the cores a rank may run on, at most its node's cores / the ranks on the node --
    all of them for the only rank of a node, half for each of two ranks on one node."""
    args = ["image", "--data", MNIST, "--image-size", "32", "--width-mult", "0.25", "--device", "cpu",
            "--threads", "0", "--limit-train", "128", "--limit-test", "32", "--epochs", "1", "--batch-size", "32",
            "--progress-interval", "1000"]
    cores = os.cpu_count()
    on_two_nodes(cluster, *args, "--results", tmp_path / "nodes.h5")
    assert_ranks_on_their_nodes(tmp_path / "nodes.h5", threads=cores)
    on_one_node(*args, "--results", tmp_path / "node.h5")
    f, run = last_run(tmp_path / "node.h5")
    with f:
        assert [run[f"rank_{r}"].attrs["threads"] for r in range(2)] == [max(1, cores // 2)] * 2


@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_lora_across_two_nodes_equals_one_node(cluster, tmp_path, sharding):
    if not MODEL.exists():
        pytest.skip(f"no tiny Llama oracle at {MODEL}")
    args = ["llm", "--model", MODEL, "--tokenizer", TOKENIZER, "--dataset", "alpaca", "--data", ALPACA, "--limit",
            "32", "--batch-size", "2", "--max-steps", "4", "--lora-rank", "4", "--precision", "fp32", "--threads", "1",
            "--progress-interval", "1000", "--device", "cpu", "--sharding", sharding]
    on_two_nodes(cluster, *args, "--results", tmp_path / "nodes.h5")
    on_one_node(*args, "--results", tmp_path / "node.h5")
    assert_same_steps(tmp_path / "nodes.h5", tmp_path / "node.h5")
    assert_ranks_on_their_nodes(tmp_path / "nodes.h5", threads=1)


def test_comm_across_two_nodes_checks_every_result(cluster, tmp_path):
    proc = on_two_nodes(cluster, "comm", "--collective", "all", "--min-bytes", "1024", "--max-bytes", "64K",
                        "--results", tmp_path / "comm.h5")
    assert "# Out of bounds values : 0 OK" in proc.stdout, proc.stdout[-3000:]
    f, run = last_run(tmp_path / "comm.h5")
    with f:
        assert run.attrs["hosts"] == "node1,node2"
        for r in range(2):
            rows = run[f"rank_{r}/comm"][:]
            written = rows[rows["bytes"] >= 0]
            assert len(written) > 0 and (written["wrong"] == 0).all()


@pytest.fixture
def own_core(tmp_path):
    """A wrapper that runs rank r on the r-th (mod their count) of the cores this process may run on
    (taskset), the 1-rank run on the first: each rank computes on a core of its own, as on a GPU of its
    own, where the scheduler would move two ranks and the launchers' daemons about the two cores."""
    cores = sorted(os.sched_getaffinity(0))
    wrap = tmp_path / "own_core.sh"
    wrap.write_text(f"#!/bin/sh\ncase $((OMPI_COMM_WORLD_RANK % {len(cores)})) in\n" +
                    "".join(f"  {i}) core={c} ;;\n" for i, c in enumerate(cores)) +
                    "esac\nexec taskset -c $core \"$@\"\n")
    wrap.chmod(0o755)
    return wrap


PREDICTION_BOUND_PCT = 15  # issue 50
ROUNDS = 5  # of the base and the 2-rank placements, interleaved; each side's median run is compared


def median_run(paths):
    """The file among `paths` (an odd count) whose (only) run took the median total_s, and every
    run's total_s."""
    totals = {}
    for path in paths:
        with h5py.File(path, "r") as f:
            (run,) = f["runs"].values()
            totals[path] = float(run["summary"][0]["total_s"])
    ordered = sorted(totals, key=totals.get)
    return ordered[len(ordered) // 2], totals


def test_predictions_across_nodes_are_bounded(cluster, tmp_path, own_core):
    """Issue 50: `mgbench predict` from a 1-rank run, the comm run of each placement and the measured
    runs of the other placements -- 2 ranks on one node, 2 nodes x 1 rank, 2 nodes x 2 ranks -- each
    priced from its own placement's comm run and learning its overlap, spread and contention from the
    other placements' runs (never its own: predict leaves those out), within PREDICTION_BOUND_PCT of
    the run measured there.

    The machine's speed is not steady from one run to the next: on this VM six identical 1-rank runs
    in a row took 6.3 to 11.5 s (session 65), and a rank alone on the machine computed 25-50 % slower
    than with the other core busy on one day (44-54 against 35 ms a step, 2026-12-01), 10 % faster on
    another (21.5 against 23.8-25.7 ms). A 1-rank base alone cannot see that: the contention a
    measured 2-rank run shows (its compute a step over the base's) carries it to the other placements
    (docs/design.md, The scaling predictor). The base and the 2-rank placements run ROUNDS times,
    interleaved, and the median run of each is predicted from and compared with: the fastest of
    several, which a run slowed by whatever else the machine did cannot move, is moved by one that
    ran unusually fast (a one-node run 15 % faster than its three others made the errors +9.8 and
    -11.6 %, their medians +1.1 and -4.1 %).

    The simulated nodes share the machine's cores: 2 nodes x 2 ranks gives each rank a core of its own
    only where there are 4; with fewer its ranks share cores, which no prediction of a device per rank
    can see: predicted and paired, not bounded."""
    image = ["image", "--data", MNIST, "--image-size", "32", "--width-mult", "0.25", "--threads", "1", "--device",
             "cpu", "--limit-train", "4096", "--limit-test", "64", "--epochs", "1", "--batch-size", "32",
             "--progress-interval", "1000"]
    comm = ["comm", "--collective", "all-reduce,broadcast", "--min-bytes", "1K", "--max-bytes", "4M",
            "--step-factor", "4", "--iters", "20"]
    placements = {"one-rank": (1, ["--host", "10.77.0.1"]), "one-node": (2, ["--host", "10.77.0.1:2"]),
                  "two-nodes": (2, ["--host", "10.77.0.1,10.77.0.2"]),
                  "two-by-two": (4, ["--host", "10.77.0.1:2,10.77.0.2:2"])}
    own_cores = len(os.sched_getaffinity(0)) >= 4

    def run(name, *args):
        np_, where = placements[name]
        cmd = [str(cluster / "mpirun"), "-np", str(np_), *where, "--bind-to", "none", own_core, BIN,
               *map(str, args)]
        proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=ENV, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]

    network_ready(cluster)
    repeats = {name: [] for name in placements}
    for k in range(ROUNDS):
        for name in placements:
            if name == "two-by-two" and k > 0 and not own_cores:
                continue  # not bounded: one run
            repeats[name].append(tmp_path / f"{name}-{k}.h5")
            run(name, *image, "--results", repeats[name][-1], "--run-name", name)
            if k == 0 and name != "one-rank":
                run(name, *comm, "--results", tmp_path / "comm.h5", "--run-name", name)
    measured = {}
    for name, paths in repeats.items():
        measured[name], totals = median_run(paths)
        print(f"{name}: total_s of the {len(paths)} run(s): {sorted(round(t, 2) for t in totals.values())}")
    # The 2-rank placements learn from each other; 2 x 2 from both (not from itself, nor, with its
    # ranks sharing cores, does it teach the others).
    predictions = tmp_path / "predictions.h5"
    given = [measured["one-rank"], measured["one-node"], measured["two-nodes"]]
    for ranks, per_node in ((2, 2), (2, 1), (4, 2)):
        proc = subprocess.run([BIN, "predict", *given, "--comm", tmp_path / "comm.h5", "--ranks", str(ranks),
                               "--ranks-per-node", str(per_node), "--strategies", "ddp-ds", "--results", predictions],
                              capture_output=True, text=True, env=ENV)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        print(*(l for l in proc.stdout.splitlines() if "contention" in l))
    run_ids = {}
    for name, path in measured.items():
        with h5py.File(path, "r") as f:
            (run_,) = f["runs"].values()
            run_ids[name] = run_.attrs["run_id"]
    with h5py.File(predictions, "r") as f:
        by_placement = {(int(r.attrs["world_size"]), int(r.attrs["nodes"])): r.attrs for r in f["runs"].values()}
        expected = {(2, 1): "one-node", (2, 2): "two-nodes", (4, 2): "two-by-two"}
        learnt = {(2, 1): ["two-nodes"], (2, 2): ["one-node"], (4, 2): ["one-node", "two-nodes"]}
        assert set(by_placement) == set(expected)
        for placement, name in expected.items():
            attrs = by_placement[placement]
            assert f"_{name}" in attrs["prediction_comm"], attrs["prediction_comm"]  # its own placement's comm run
            assert sorted(attrs["prediction_scaling_runs"].split(",")) == sorted(run_ids[n] for n in learnt[placement])
            assert attrs["prediction_contention"] != 1.0 and attrs["prediction_spread"] > 1.0  # measured there
    report = subprocess.run([BIN, "report", *measured.values(), predictions], capture_output=True, text=True,
                            env=ENV).stdout
    checks = [l.split() for l in report.splitlines() if l.startswith("  ") and "_predicted-" in l]
    assert len(checks) == 3, report
    errors = {}
    for row in checks:  # prediction, ranks, nodes, strategy, precision, size, predicted, measured run, measured, error
        placement = (int(row[1]), int(row[2]))
        assert row[7].endswith(expected[placement]), row
        errors[placement] = float(row[-1])
        print(f"{placement[0]} ranks on {placement[1]} node(s): predicted {row[6]} s, measured {row[8]} s, "
              f"error {row[-1]} %")
    bounded = [(2, 1), (2, 2)] + ([(4, 2)] if own_cores else [])
    assert all(abs(errors[p]) <= PREDICTION_BOUND_PCT for p in bounded), errors


def ranks_alive(results):
    """pids of mgbench ranks (not zombies) writing `results`."""
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if argv and argv[0] == BIN.encode() and str(results).encode() in argv and state != "Z":
            alive.append(int(pid))
    return alive


def end_job(proc, cluster):
    """Kills mpirun and the daemons it started on the nodes (their command lines name the cluster's
    rsh agent)."""
    proc.kill()
    proc.wait(timeout=60)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if str(cluster).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


def network_ready(cluster, tries=5):
    """The nodes' daemons can start and reach mpirun (after a fault test, the network may need a moment)."""
    for _ in range(tries):
        cmd = [str(cluster / "mpirun"), "-np", "2", "--hostfile", str(cluster / "hostfile"), "hostname"]
        if subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=60).returncode == 0:
            return
        time.sleep(2)
    raise AssertionError("the simulated nodes do not reach each other")


def wait_for_training(results, log, ranks=2, timeout=120):
    """Waits until `ranks` ranks write `results` and mpirun's `log` shows a training step (the run
    exists in the file before its first step: a rank lost earlier leaves no run to read, so a fixed
    wait after the ranks start raced the set-up under load); their pids."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if len(ranks_alive(results)) == ranks and re.search(r"^epoch \d+/\d+ step \d+/", log.read_text(), re.M):
            break
        time.sleep(0.2)
    pids = ranks_alive(results)
    assert len(pids) == ranks, pids
    assert "results: " in log.read_text(), log.read_text()
    return pids


def report_rows(results):
    proc = subprocess.run([BIN, "report", str(results)], capture_output=True, text=True, env=ENV)
    return [line.split() for line in proc.stdout.splitlines() if line.startswith("  ")], proc.stdout + proc.stderr


def cluster_state(cluster, key):
    """The names cluster.sh recorded under `key` (switch, node) in DIR/state."""
    return [l.split("=", 1)[1] for l in (cluster / "state").read_text().splitlines() if l.startswith(key + "=")]


class LinkCut:
    """node2's switch port down; up again afterwards (and the nodes forget the neighbour entries that
    failed meanwhile, so that the next job's daemons connect at once)."""
    def __init__(self, cluster):
        self.cluster, self.switch = cluster, cluster_state(cluster, "switch")[0]
        self.veth = self.switch.replace("-switch", "-v2")  # node2's port on the switch
        self.frozen = []

    def start(self):
        subprocess.run(["ip", "-n", self.switch, "link", "set", self.veth, "down"], check=True)

    def undo(self):
        subprocess.run(["ip", "-n", self.switch, "link", "set", self.veth, "up"])
        for node in cluster_state(self.cluster, "node"):
            subprocess.run(["ip", "-n", node, "neigh", "flush", "all"])


class NodeStopped(LinkCut):
    """Every process of node2 (its rank, its Open MPI daemon) SIGSTOPped: a node that hangs with its
    network up (the kernel still answers TCP); killed afterwards."""
    def start(self):
        node2 = next(n for n in cluster_state(self.cluster, "node") if n.endswith("-node2"))
        pids = subprocess.run(["ip", "netns", "pids", node2], capture_output=True, text=True, check=True).stdout
        self.frozen = [int(p) for p in pids.split()]
        assert self.frozen, "no process on node2"
        for pid in self.frozen:
            os.kill(pid, signal.SIGSTOP)

    def undo(self):
        for pid in self.frozen:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("fault", [LinkCut, NodeStopped], ids=["link-cut", "node-stopped"])
def test_a_lost_node_ends_the_whole_job_and_the_run_reads_aborted_with_the_census(cluster, tmp_path, fault):
    """node2 lost mid-run, --comm-timeout 5 -- its link cut, or all its processes stopped: each live
    rank's watchdog takes a census, records it as the run's error (status `aborted`) and ends the job;
    every live rank is gone within the timeout + the census (3 s) + the recording (<= 5 s) + MPI_Abort's
    own limit (10 s). mpirun itself waits for the lost daemon's answer forever (behind a cut link TCP
    retransmits its kill message ~15 min; a stopped daemon never reads it): the aborting rank's
    launcher guard ends it launcher_guard::kGraceS (15 s) after the abort, so the whole job is gone
    within 60 s of the loss. The earlier run of the file is intact."""
    results = tmp_path / "r.h5"
    image = ["image", "--data", MNIST, "--image-size", "64", "--width-mult", "0.25", "--threads", "1", "--device", "cpu",
             "--batch-size", "32", "--progress-interval", "1", "--results", results]
    network_ready(cluster)
    on_two_nodes(cluster, *image, "--limit-train", "128", "--limit-test", "32", "--epochs", "1")  # the earlier run
    cmd = [str(cluster / "mpirun"), "-np", "2", "--hostfile", str(cluster / "hostfile"), "--bind-to", "none", BIN,
           *map(str, image), "--epochs", "3", "--limit-train", "8192", "--limit-test", "64", "--comm-timeout", "5"]
    lost = fault(cluster)
    log = open(tmp_path / "mpirun.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ENV)
    try:
        wait_for_training(results, tmp_path / "mpirun.log")
        lost.start()
        started = time.time()
        live = lambda: [p for p in ranks_alive(results) if p not in lost.frozen]  # noqa: E731
        while live() and time.time() - started < 60:
            time.sleep(0.2)
        ranks_gone_s = time.time() - started
        log_tail = (tmp_path / "mpirun.log").read_text()[-6000:]
        assert not live(), f"ranks still alive 60 s after node2 was lost; mpirun's log ends:\n{log_tail}"
        assert ranks_gone_s <= 5 + 3 + 5 + 10 + 3, f"{ranks_gone_s:.1f} s; mpirun's log ends:\n{log_tail}"
        try:
            proc.wait(timeout=max(1.0, 60 - (time.time() - started)))
        except subprocess.TimeoutExpired:
            pass
        job_gone_s = time.time() - started
        assert proc.returncode is not None, "mpirun still runs 60 s after node2 was lost"
        assert proc.returncode == -signal.SIGKILL, f"mpirun ended with {proc.returncode}, not by the guard"
    finally:
        lost.undo()
        end_job(proc, cluster)  # the daemon left on node2 (it ends when its link returns)
    print(f"node2 lost ({fault.__name__}): ranks gone after {ranks_gone_s:.1f} s, mpirun after {job_gone_s:.1f} s")
    assert "still runs 15 s after rank " in (tmp_path / "mpirun.log").read_text(), "the guard's message"
    rows, out = report_rows(results)
    assert [r[1] for r in rows] == ["completed", "aborted"], out
    assert "did not complete in 5 s" in out and "the ranks: rank " in out and "aborting the job (--comm-timeout)" in out


def test_a_killed_rank_ends_the_job_and_a_run_nobody_closed_reads_aborted(cluster, tmp_path):
    """node2's rank SIGKILLed: mpirun ends the job; the run, which no rank could close, reads
    'aborted' (its file's write lock is free), not 'running'."""
    results = tmp_path / "r.h5"
    cmd = [str(cluster / "mpirun"), "-np", "2", "--hostfile", str(cluster / "hostfile"), "--bind-to", "none", BIN,
           "image", "--data", str(MNIST), "--image-size", "64", "--width-mult", "0.25", "--threads", "1", "--device",
           "cpu", "--epochs", "3", "--batch-size", "32", "--limit-train", "8192", "--limit-test", "64",
           "--progress-interval", "1", "--results", str(results)]
    network_ready(cluster)
    log = open(tmp_path / "mpirun.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ENV)
    try:
        pids = wait_for_training(results, tmp_path / "mpirun.log")
        os.kill(max(pids), signal.SIGKILL)  # one of the two ranks
        proc.wait(timeout=120)  # mpirun sees a rank die and ends the job
    finally:
        end_job(proc, cluster)
    assert not ranks_alive(results)
    rows, out = report_rows(results)
    assert [r[1] for r in rows] in (["aborted"], ["failed"]), out
    if rows[0][1] == "aborted":
        assert "aborted: the job ended without closing the run" in out
