"""The slurm/ scripts against a real one-node SLURM (slurmctld, slurmd, munged from Debian's packages,
started by tests/slurm/cluster.sh and stopped by pid). CPU variants: --gpus-per-node=0, --device cpu.

Skipped, with the reason, where a SLURM cannot be started (not root, packages absent).
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import BIN, ENV, SHARED, SMALL, hold_library, pending, stopped

h5py = pytest.importorskip("h5py")

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"
MNIST = SHARED / "mnist"
MODEL = Path(os.environ.get("MGBENCH_ORACLE_DIR", "")) / "llama_tiny_2256"
CPU = ["--gpus-per-node=0", "--cpus-per-task=1", "--time=10"]
IMAGE_ARGS = ["--device", "cpu", "--data", MNIST, "--image-size", "32", "--width-mult", "0.25", "--threads", "1",
              "--limit-test", "128", "--batch-size", "32", "--progress-interval", "1000"]


@pytest.fixture(scope="module")
def slurm():
    if not (MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"no MNIST at {MNIST}")
    # Not below pytest's base directory: pytest (9) keeps /tmp/pytest-of-<user> at 0700, re-tightened
    # by every pytest session (ctest runs two at once), and munged and slurmd, other users, must
    # traverse the path to their files.
    d = Path(tempfile.mkdtemp(prefix="mgbench-slurm-"))
    os.chmod(d, 0o755)
    started = subprocess.run([str(CLUSTER), "start", str(d)], capture_output=True, text=True)
    if started.returncode != 0:
        shutil.rmtree(d, ignore_errors=True)
    if started.returncode == 77:
        pytest.skip(started.stderr.strip().splitlines()[-1])
    assert started.returncode == 0, started.stdout + started.stderr
    env = dict(ENV, SLURM_CONF=str(d / "slurm.conf"), PATH=os.environ["PATH"] + ":/usr/sbin", MGBENCH=BIN)
    env.pop("OMPI_MCA_rmaps_base_oversubscribe", None)
    try:
        yield env
    finally:
        subprocess.run([str(CLUSTER), "stop", str(d)])
        shutil.rmtree(d, ignore_errors=True)


def held_rank(job):
    """The pid of SLURM job `job`'s mgbench rank stopped by conftest.hold_library, or None."""
    binary = os.path.realpath(BIN)
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(proc / "exe") != binary:
                continue
            if f"SLURM_JOB_ID={job}".encode() not in (proc / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        if stopped(int(proc.name)):
            return int(proc.name)
    return None


def sbatch(env, *args, wait=True, cwd=ROOT):
    cmd = ["sbatch", "--parsable", *(["--wait"] if wait else []), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)


def completed_job(proc, log_dir):
    """The job id of an `sbatch --parsable --wait` that succeeded; its logs (*.out) when it did not."""
    log = "\n".join(Path(p).read_text() for p in glob.glob(f"{log_dir}/*.out"))
    assert proc.returncode == 0, proc.stderr + log
    return proc.stdout.strip().split(";")[0]


# SLURM's states of a job not yet ended (squeue(1), JOB STATE CODES): COMPLETING is a job whose
# processes are ending and whose epilog runs, after the batch script has returned.
UNFINISHED = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")


def job_state(env, job):
    out = subprocess.run(["scontrol", "show", "job", str(job)], capture_output=True, text=True, env=env).stdout
    state = re.search(r"JobState=(\S+)", out)
    restarts = re.search(r"Restarts=(\d+)", out)
    return (state.group(1) if state else "GONE"), int(restarts.group(1)) if restarts else 0


def controller_log(env, job):
    """slurmctld's log lines about one job, for a failure message."""
    conf = Path(env["SLURM_CONF"]).read_text()
    path = Path(re.search(r"^SlurmctldLogFile=(\S+)", conf, re.M).group(1))
    lines = [l for l in path.read_text().splitlines() if re.search(rf"JobId={job}\b", l)]
    return "\nslurmctld:\n" + "\n".join(lines)


def only_run(path):
    f = h5py.File(path, "r")
    (run,) = f["runs"].values()
    return f, run


def test_every_script_passes_sbatch_test_only(slurm, tmp_path):
    for script in sorted((ROOT / "slurm").glob("*.sbatch")):
        proc = sbatch(slurm, "--test-only", *CPU, "--ntasks-per-node=1", f"--output={tmp_path}/%j.out", script,
                      wait=False)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"
    env = dict(slurm, GPUS="1 2", STRATEGIES="ddp-ds", PRECISIONS="fp32", PIN="false", SIZES="32", MNIST=str(MNIST),
               OUTPUTS=str(tmp_path / "m"))
    proc = subprocess.run([str(ROOT / "slurm" / "matrix.sh"), "image", "--cpu", "--test-only"], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0 and "2 job(s)" in proc.stderr, proc.stderr
    # The LLM points need the model (the default preset loads a checkpoint): refused before any job without it.
    proc = subprocess.run([str(ROOT / "slurm" / "matrix.sh"), "llm", "--dry-run"], capture_output=True, text=True,
                          env=dict(slurm, GPUS="1 2 4"))
    assert proc.returncode == 2 and "-- --model DIR" in proc.stderr and not proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run([str(ROOT / "slurm" / "matrix.sh"), "llm", "--dry-run", "--", "--model", "/models/llama"],
                          capture_output=True, text=True, env=dict(slurm, GPUS="1 2 4"))
    assert proc.returncode == 0 and proc.stdout.count("slurm/llm.sbatch") == 3 * 4 * 2, proc.stdout + proc.stderr
    assert proc.stdout.count("--model /models/llama") == 3 * 4 * 2
    # Run here (--local): each training point writes its adapter, an --eval-only one no --output-dir
    # (refused with it: the matrix of evaluations failed at every point).
    for extra, outputs in (([], 4 * 2), (["--eval-only"], 0)):
        proc = subprocess.run([str(ROOT / "slurm" / "matrix.sh"), "llm", "--local", "--dry-run", "--", "--model", "/m",
                               *extra], capture_output=True, text=True, env=dict(slurm, GPUS="1"))
        assert proc.returncode == 0 and proc.stdout.count("mgbench llm") == 4 * 2, proc.stdout + proc.stderr
        assert proc.stdout.count("--output-dir") == outputs, proc.stdout


def test_image_script_runs_one_rank_per_task_under_srun_pmix(slurm, tmp_path):
    env = dict(slurm, MGBENCH_OUTPUTS=str(tmp_path / "out"))
    proc = sbatch(env, *CPU, "--ntasks-per-node=2", f"--output={tmp_path}/%j.out", "slurm/image.sbatch",
                  *IMAGE_ARGS, "--limit-train", "256", "--epochs", "1")
    job = completed_job(proc, tmp_path)
    f, run = only_run(tmp_path / "out" / job / "results.h5")
    with f:
        assert run["status"][0] == b"completed"
        assert run.attrs["world_size"] == 2 and run.attrs["slurm_job_id"] == job
        # The platform record (issue 29) as SLURM set it for this allocation.
        host = run["rank_0"].attrs["hostname"]
        assert run.attrs["slurm_partition"] == "test" and run.attrs["slurm_cluster"] == "mgbench-test"
        assert run.attrs["slurm_nodelist"] == host and run.attrs["slurm_nnodes"] == "1"
        assert run.attrs["slurm_tasks_per_node"] == "2" and run.attrs["slurm_cpus_per_task"] == "1"
        assert run.attrs["nodes"] == 1 and run.attrs["cpu_cores"] == os.cpu_count()
        assert sorted(run[f"rank_{r}"].attrs["local_rank"] for r in (0, 1)) == [0, 1]
        assert run.attrs["backend"] == "mpi" and run["summary"][0]["test_accuracy"] > 0


def test_llm_script_runs_and_writes_adapters(slurm, tmp_path):
    """Into MGBENCH_JOB_DIR where it is given (a job continuing another's run) instead of outputs/<job id>."""
    if not MODEL.exists():
        pytest.fail(f"no oracle model at {MODEL}: ctest runs the oracles fixture first")
    env = dict(slurm, MGBENCH_OUTPUTS=str(tmp_path / "out"), MGBENCH_JOB_DIR=str(tmp_path / "out" / "earlier"))
    proc = sbatch(env, *CPU, "--ntasks-per-node=2", f"--output={tmp_path}/%j.out", "slurm/llm.sbatch",
                  "--device", "cpu", "--model", MODEL, "--tokenizer", SHARED / "llama3" / "tiktoken_small.model",
                  "--dataset", "alpaca", "--data", SHARED / "text" / "alpaca" / "alpaca_cleaned_first5k.json",
                  "--limit", "32", "--batch-size", "2", "--max-steps", "3", "--warmup-steps", "1", "--lora-rank", "4",
                  "--precision", "fp32", "--progress-interval", "1000")
    job = completed_job(proc, tmp_path)
    assert not (tmp_path / "out" / job).exists()
    assert (tmp_path / "out" / "earlier" / "adapter" / "adapter_model.safetensors").exists()
    f, run = only_run(tmp_path / "out" / "earlier" / "results.h5")
    with f:
        assert run["status"][0] == b"completed" and run.attrs["task"] == "llm" and run.attrs["world_size"] == 2


def test_matrix_points_are_analysed_together(slurm, tmp_path):
    """Run from a directory of the user's, not the checkout (as the module's $MGBENCH_SHARE/slurm/matrix.sh
    is): the jobs find the scripts and the outputs land below that directory, not beside the scripts."""
    env = dict(slurm, GPUS="1 2", STRATEGIES="ddp-ds", PRECISIONS="fp32", PIN="false", SIZES="32", MNIST=str(MNIST))
    proc = subprocess.run([str(ROOT / "slurm" / "matrix.sh"), "image", "--cpu", "--", "--width-mult", "0.25",
                           "--threads", "1", "--limit-train", "128", "--limit-test", "64", "--epochs", "1",
                           "--batch-size", "32", "--progress-interval", "1000"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (outputs,) = (tmp_path / "outputs").glob("matrix-image-*")
    jobs = proc.stdout.split()
    assert len(jobs) == 2
    deadline = time.time() + 400
    while time.time() < deadline and any(job_state(env, j)[0] in UNFINISHED for j in jobs):
        time.sleep(1)
    states = [job_state(env, j)[0] for j in jobs]
    logs = "\n".join(Path(p).read_text() for p in glob.glob(f"{outputs}/*.out"))
    assert states == ["COMPLETED", "COMPLETED"], f"{states}\n{logs}"
    report = subprocess.run([BIN, "report", "--csv", f"{outputs}/*/results.h5"], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    rows = report.stdout.strip().splitlines()[1:]
    assert len(rows) == 2 and all(",completed," in r for r in rows), report.stdout
    assert sorted(r.split(",")[3] for r in rows) == ["1", "2"]  # the ranks column


@pytest.mark.parametrize("launcher, stop, scope", [("srun", "USR1", "--batch"), ("mpirun", "TERM", "--batch"),
                                                   ("srun", "TERM", "--batch"), ("srun", "TERM", "--full")])
def test_a_stop_signal_checkpoints_requeues_and_resumes(slurm, tmp_path, launcher, stop, scope):
    """USR1 is what `#SBATCH --signal=B:USR1@120` sends two minutes before the time limit, to the batch
    shell; TERM is scancel's. Both launchers answer a SIGTERM of their own by ending the job (srun:
    "forcing job termination", the tasks SIGKILLed; Open MPI's mpirun: exit 1), so the batch script
    forwards SIGTERM as SIGUSR1, and starts the launcher in a session of its own, out of reach of a
    signal to the batch step's processes (`scancel --full`, as SLURM's time limit and preemption
    signal the job): the job exits 75, requeues and resumes. Before, both srun cases ended killed."""
    # Rank 0 stops itself once it has committed the checkpoint of step 2 (conftest.hold_library; once in
    # the job, not again when it resumes), so that the signal lands mid-run however fast the steps after
    # it run: polling for the checkpoint raced the run's end on a slow or busy machine.
    env = dict(slurm, MGBENCH_OUTPUTS=str(tmp_path / "out"), MGBENCH_CHECKPOINT_EVERY="2", MGBENCH_LAUNCHER=launcher,
               LD_PRELOAD=str(hold_library()), MGBENCH_TEST_HOLD_STEP="2",
               MGBENCH_TEST_HOLD_ONCE=str(tmp_path / "held"))
    proc = sbatch(env, *CPU, "--ntasks-per-node=2", f"--output={tmp_path}/job.out", "slurm/image.sbatch",
                  *IMAGE_ARGS, "--limit-train", "1024", "--epochs", "2", "--precision", "fp64", wait=False)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    deadline = time.time() + 300
    while (held := held_rank(job)) is None:
        assert time.time() < deadline and job_state(env, job)[0] in ("PENDING", "RUNNING", "CONFIGURING"), \
            (tmp_path / "job.out").read_text()
        time.sleep(0.1)
    subprocess.run(["scancel", scope, f"--signal={stop}", job], check=True, env=env)
    # The batch script forwards the signal as SIGUSR1 through the launcher (--full: the step's own
    # SIGTERM may come first); once it is pending, the rank continues and takes it.
    deadline = time.time() + 60
    while not (pending(held, signal.SIGUSR1) or pending(held, signal.SIGTERM)):
        assert time.time() < deadline, "the signal never reached the held rank\n" + (tmp_path / "job.out").read_text()
        time.sleep(0.02)
    os.kill(held, signal.SIGCONT)
    deadline = time.time() + 500
    released = False
    while time.time() < deadline:
        state, restarts = job_state(env, job)
        if state == "COMPLETED" or state in ("FAILED", "CANCELLED", "TIMEOUT", "GONE"):
            break
        if state == "PENDING" and restarts == 1 and not released:
            # SLURM holds a requeued job ~2 minutes (its BeginTime); an operator's release keeps the test short,
            # but not within the second of the requeue: slurmctld refuses a credential issued in the second
            # the old one was revoked ("Killing non-startable batch JobId=N: Job credential revoked").
            time.sleep(2)
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=env)
            released = True
        time.sleep(0.5)
    log = (tmp_path / "job.out").read_text()
    assert (state, restarts) == ("COMPLETED", 1), log + controller_log(env, job)
    assert "requeueing job" in log and "stopped on SIGUSR1" in log, log  # SIGTERM forwarded as SIGUSR1
    f, run = only_run(tmp_path / "out" / job / "results.h5")
    with f:
        assert run["status"][0] == b"completed" and run.attrs["resumes"] == 1
        steps = run["rank_0"]["steps"][:]
        assert (steps["step_s"] > 0).all()  # every step of both epochs recorded, once


def test_missing_binary_fails_fast_with_the_path(slurm, tmp_path):
    env = dict(slurm, MGBENCH="/nonexistent/mgbench")
    proc = sbatch(env, *CPU, "--ntasks-per-node=1", f"--output={tmp_path}/%j.out", "slurm/image.sbatch")
    assert proc.returncode != 0
    log = "\n".join(Path(p).read_text() for p in glob.glob(f"{tmp_path}/*.out"))
    assert "mgbench binary '/nonexistent/mgbench' not found" in log, log


def test_image_script_with_open_mpi_mpirun_inside_the_allocation(slurm, tmp_path):
    env = dict(slurm, MGBENCH_OUTPUTS=str(tmp_path / "out"), MGBENCH_LAUNCHER="mpirun")
    proc = sbatch(env, *CPU, "--ntasks-per-node=2", f"--output={tmp_path}/%j.out", "slurm/image.sbatch",
                  *IMAGE_ARGS, "--limit-train", "128", "--epochs", "1")
    job = completed_job(proc, tmp_path)
    f, run = only_run(tmp_path / "out" / job / "results.h5")
    with f:
        assert run["status"][0] == b"completed" and run.attrs["world_size"] == 2


def stand_in_ranks(tmp_path):
    """An executable that stands for mgbench: each rank writes what SLURM gave it (task, local id,
    CUDA_VISIBLE_DEVICES) to <dir>/rank<id>. Where the GPUs are stand-ins (tests/slurm/cluster.sh's
    GRES), this is what a GPU rank would see."""
    script = tmp_path / "ranks.sh"
    script.write_text('#!/bin/sh\necho "$SLURM_PROCID $SLURM_LOCALID ${CUDA_VISIBLE_DEVICES-unset}" '
                      f'> "{tmp_path}/rank$SLURM_PROCID"\n')
    script.chmod(0o755)
    return str(script)


def ranks_saw(tmp_path, n):
    seen = {}
    for r in range(n):
        procid, localid, visible = (tmp_path / f"rank{r}").read_text().split()
        seen[int(procid)] = (int(localid), visible)
    return seen


@pytest.mark.parametrize("allocation,visible", [
    (["--gpus-per-node=2"], ["0,1", "0,1"]),
    (["--gpus-per-node=0", "--gpus-per-task=1"], ["0", "1"]),
], ids=["per-node", "per-task"])
def test_gpus_as_gres_reach_the_ranks_as_the_scripts_ask(slurm, tmp_path, allocation, visible):
    """Two ranks on a node with two (stand-in) GPUs: --gpus-per-node (the scripts' way) lets every
    rank see both GPUs, so NCCL can find the peer-to-peer paths between them; --gpus-per-task gives
    each rank its own (runtime/device.h: the rank then takes its one visible device and warns)."""
    env = dict(slurm, MGBENCH=stand_in_ranks(tmp_path), MGBENCH_OUTPUTS=str(tmp_path / "out"))
    proc = sbatch(env, *allocation, "--cpus-per-task=1", "--time=10", "--ntasks-per-node=2",
                  f"--output={tmp_path}/%j.out", "slurm/image.sbatch")
    completed_job(proc, tmp_path)
    assert ranks_saw(tmp_path, 2) == {0: (0, visible[0]), 1: (1, visible[1])}


def test_a_job_without_gpus_per_node_launches(slurm, tmp_path):
    """A job script of the user's that sources common.sh in an allocation asking no --gpus-per-node
    (SLURM sets no SLURM_GPUS_PER_NODE) launches its ranks (was: bash's 'unbound variable' under set -u)."""
    job_script = tmp_path / "job.sbatch"
    job_script.write_text("#!/bin/bash\n#SBATCH --time=10\nset -euo pipefail\nMGBENCH_SCRIPT=job.sbatch\n"
                          f"source {ROOT}/slurm/common.sh\nmgbench_setup\nmgbench_run image\n")
    env = dict(slurm, MGBENCH=stand_in_ranks(tmp_path), MGBENCH_OUTPUTS=str(tmp_path / "out"))
    proc = sbatch(env, "--cpus-per-task=1", "--ntasks=2", "--nodes=1", f"--output={tmp_path}/%j.out", job_script)
    completed_job(proc, tmp_path)
    assert sorted(ranks_saw(tmp_path, 2)) == [0, 1]


@pytest.mark.parametrize("tasks", [["--ntasks-per-node=2"], ["--ntasks=2", "--nodes=1"]],
                         ids=["ntasks-per-node", "ntasks-only"])
def test_fewer_gpus_per_node_than_ranks_is_refused_before_launch(slurm, tmp_path, tasks):
    """Two ranks on a node given one GPU would share it (NCCL refuses two ranks on one device): the
    scripts' guard (slurm/common.sh) ends the job before launching anything, naming the fix -- from
    the tasks SLURM placed (SLURM_TASKS_PER_NODE), with or without --ntasks-per-node (a job script
    of the user's that sources common.sh and asks only --ntasks)."""
    job_script = tmp_path / "job.sbatch"
    job_script.write_text("#!/bin/bash\n#SBATCH --time=10\nset -euo pipefail\nMGBENCH_SCRIPT=job.sbatch\n"
                          f"source {ROOT}/slurm/common.sh\nmgbench_setup\nmgbench_run image\n")
    env = dict(slurm, MGBENCH=stand_in_ranks(tmp_path), MGBENCH_OUTPUTS=str(tmp_path / "out"))
    proc = sbatch(env, "--gpus-per-node=1", "--cpus-per-task=1", *tasks, f"--output={tmp_path}/%j.out", job_script)
    log = "\n".join(Path(p).read_text() for p in glob.glob(f"{tmp_path}/*.out"))
    assert proc.returncode != 0, log
    assert "2 rank(s) on a node" in log and "one rank per GPU (pass --gpus-per-node=2" in log, log
    assert not list(tmp_path.glob("rank[0-9]*")), "a rank was launched"
