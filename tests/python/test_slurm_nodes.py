"""The slurm/ scripts across two nodes (issue 30): the simulated cluster of tests/cluster/cluster.sh
(namespaces as nodes) with SLURM on it (tests/slurm/cluster.sh start DIR NODES: slurmctld on node1,
one slurmd per node). One job spans both nodes under either launcher; a stop signal requeues a
two-node job that resumes; a node lost mid-job (its slurmd and every process of it killed) ends the
job, the run recorded as aborted with the watchdog's census.

Skipped, with the reason, where namespaces or a SLURM cannot be made (not root, packages absent)."""
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import BIN, ENV
from test_slurm import CLUSTER as SLURM, CPU as ONE_NODE_CPU, IMAGE_ARGS, MNIST, ROOT, only_run

NODES = ROOT / "tests" / "cluster" / "cluster.sh"
CPU = ["--nodes=2", "--ntasks-per-node=1", *ONE_NODE_CPU]


@pytest.fixture(scope="module")
def nodes():
    """(the simulated cluster's directory, the environment for SLURM's commands on node1)."""
    if not (MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"no MNIST at {MNIST}")
    # Not below pytest's base directory (kept 0700): munged and slurmd must traverse the path.
    cluster, slurm = (Path(tempfile.mkdtemp(prefix=p)) for p in ("mgbench-nodes-", "mgbench-nodes-slurm-"))
    os.chmod(slurm, 0o755)
    try:
        started = subprocess.run([str(NODES), "start", str(cluster), "2"], capture_output=True, text=True)
        if started.returncode == 77:
            pytest.skip(started.stderr.strip().splitlines()[-1])
        assert started.returncode == 0, started.stdout + started.stderr
        started = subprocess.run([str(SLURM), "start", str(slurm), str(cluster)], capture_output=True, text=True)
        if started.returncode == 77:
            pytest.skip(started.stderr.strip().splitlines()[-1])
        assert started.returncode == 0, started.stdout + started.stderr
        env = dict(ENV, SLURM_CONF=str(slurm / "slurm.conf"), PATH=os.environ["PATH"] + ":/usr/sbin", MGBENCH=BIN)
        env.pop("OMPI_MCA_rmaps_base_oversubscribe", None)
        yield cluster, env
    finally:
        subprocess.run([str(SLURM), "stop", str(slurm)])
        subprocess.run([str(NODES), "stop", str(cluster)])
        shutil.rmtree(slurm, ignore_errors=True)
        shutil.rmtree(cluster, ignore_errors=True)


def on_node1(nodes, *cmd, env=None, timeout=600):
    """A command on node1 (SLURM's controller answers on the nodes' network only), from the checkout."""
    cluster, slurm_env = nodes
    return subprocess.run([str(cluster / "run"), "node1", *map(str, cmd)], capture_output=True, text=True,
                          env=env or slurm_env, cwd=ROOT, timeout=timeout)


def sbatch(nodes, env, *args, wait=True):
    return on_node1(nodes, "sbatch", "--parsable", *(["--wait"] if wait else []), *args, env=env)


def job_state(nodes, job):
    out = on_node1(nodes, "scontrol", "show", "job", job).stdout
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    return fields.get("JobState", "GONE"), int(fields.get("Restarts", "0"))


def logs(directory):
    return "\n".join(Path(p).read_text() for p in glob.glob(f"{directory}/*.out"))


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_image_script_spans_two_nodes(nodes, tmp_path, launcher):
    """`sbatch --nodes=2 --ntasks-per-node=1`: a rank on each node, each its node's local rank 0, one
    results file written from both hosts, the allocation recorded as SLURM set it."""
    env = dict(nodes[1], MGBENCH_OUTPUTS=str(tmp_path / "out"), MGBENCH_LAUNCHER=launcher)
    proc = sbatch(nodes, env, *CPU, f"--output={tmp_path}/%j.out", "slurm/image.sbatch", *IMAGE_ARGS,
                  "--limit-train", "256", "--epochs", "1")
    assert proc.returncode == 0, proc.stderr + logs(tmp_path)
    job = proc.stdout.strip().split(";")[0]
    assert "2 task(s) on 2 node(s)" in logs(tmp_path)
    f, run = only_run(tmp_path / "out" / job / "results.h5")
    with f:
        assert run["status"][0] == b"completed" and run.attrs["world_size"] == 2
        assert run.attrs["hosts"] == "node1,node2" and run.attrs["nodes"] == 2
        assert run.attrs["slurm_nodelist"] == "node[1-2]" and run.attrs["slurm_nnodes"] == "2"
        assert run.attrs["slurm_tasks_per_node"] == "1"
        assert [run[f"rank_{r}"].attrs["hostname"] for r in (0, 1)] == ["node1", "node2"]
        assert [int(run[f"rank_{r}"].attrs["local_rank"]) for r in (0, 1)] == [0, 0]
        for r in (0, 1):
            assert (run[f"rank_{r}"]["steps"][:]["step_s"] > 0).all()  # each host wrote its rows


def test_a_stop_signal_requeues_a_two_node_job_that_resumes(nodes, tmp_path):
    """SIGUSR1 to the batch shell (what `--signal=B:USR1@120` sends): both nodes' ranks checkpoint and
    exit 75, the job requeues, and its second start resumes the run on both nodes to the end."""
    env = dict(nodes[1], MGBENCH_OUTPUTS=str(tmp_path / "out"), MGBENCH_CHECKPOINT_EVERY="2")
    proc = sbatch(nodes, env, *CPU, f"--output={tmp_path}/job.out", "slurm/image.sbatch", *IMAGE_ARGS,
                  "--limit-train", "1024", "--epochs", "2", "--precision", "fp64", wait=False)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    checkpoints = tmp_path / "out" / job / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and not glob.glob(f"{checkpoints}/*/step-?????????"):
        assert job_state(nodes, job)[0] in ("PENDING", "RUNNING", "CONFIGURING"), logs(tmp_path)
        time.sleep(0.2)
    assert on_node1(nodes, "scancel", "--batch", "--signal=USR1", job).returncode == 0
    deadline, released = time.time() + 500, False
    while time.time() < deadline:
        state, restarts = job_state(nodes, job)
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "GONE"):
            break
        if state == "PENDING" and restarts == 1 and not released:
            time.sleep(2)  # not within the second of the requeue (test_slurm.py says why)
            on_node1(nodes, "scontrol", "update", f"JobId={job}", "StartTime=now")
            released = True
        time.sleep(0.5)
    log = logs(tmp_path)
    assert (state, restarts) == ("COMPLETED", 1), log
    assert "requeueing job" in log and "stopped on SIGUSR1" in log, log
    f, run = only_run(tmp_path / "out" / job / "results.h5")
    with f:
        assert run["status"][0] == b"completed" and run.attrs["resumes"] == 1
        for r in (0, 1):
            assert (run[f"rank_{r}"]["steps"][:]["step_s"] > 0).all()  # every step of both epochs, once


def test_a_lost_node_ends_the_job_and_the_run_reads_aborted(nodes, tmp_path):
    """Every process of node2 -- its slurmd, the step's slurmstepd, its rank -- SIGKILLed mid-job, as a
    node that powers off: node1's rank times out in its collective (--comm-timeout 5), records the
    census as the run's error, and the job ends. Runs last: node2 has no slurmd afterwards."""
    cluster, _ = nodes
    env = dict(nodes[1], MGBENCH_OUTPUTS=str(tmp_path / "out"))
    proc = sbatch(nodes, env, *CPU, f"--output={tmp_path}/job.out", "slurm/image.sbatch", *IMAGE_ARGS,
                  "--limit-train", "8192", "--epochs", "3", "--comm-timeout", "5", wait=False)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    results = tmp_path / "out" / job / "results.h5"
    node2 = next(l.split("=", 1)[1] for l in (cluster / "state").read_text().splitlines()
                 if l.startswith("node=") and l.endswith("-node2"))
    deadline = time.time() + 120
    while time.time() < deadline and "step 1/" not in logs(tmp_path) and "epoch 1/3" not in logs(tmp_path):
        time.sleep(0.2)
    time.sleep(3)  # training under way on both nodes
    assert job_state(nodes, job)[0] == "RUNNING", logs(tmp_path)
    pids = subprocess.run(["ip", "netns", "pids", node2], capture_output=True, text=True, check=True).stdout.split()
    assert pids
    lost = time.time()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    # The batch script ends (COMPLETING: SLURM then waits for the lost node's slurmd, until it marks
    # the node down after SlurmdTimeout -- 300 s by default).
    while time.time() - lost < 120 and job_state(nodes, job)[0] in ("RUNNING", "CONFIGURING"):
        time.sleep(0.5)
    ended_s = time.time() - lost
    state = job_state(nodes, job)[0]
    assert state not in ("RUNNING", "CONFIGURING"), f"the job still runs {ended_s:.0f} s after node2 was lost"
    # The watchdog (5 s), its census (3 s), the recording (<= 5 s), MPI_Abort's limit (10 s), srun's
    # step teardown (KillWait 10 s).
    assert ended_s <= 5 + 3 + 5 + 10 + 10 + 5, ended_s
    f, run = only_run(results)
    with f:
        status, error = run["status"][0].decode(), run["error"][0].decode()
    assert status == "aborted", (status, error, logs(tmp_path))
    assert "did not complete in 5 s" in error and "the ranks: rank " in error, error
    print(f"node2 lost: job {state} after {ended_s:.1f} s")
