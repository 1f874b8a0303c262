"""Shared fixtures of mgbench's Python-driven tests: the binary, mpirun, the shared data."""
import glob
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

BIN = os.environ.get("MGBENCH_BIN", str(Path(__file__).resolve().parents[2] / "build" / "app" / "mgbench"))
MPIEXEC = os.environ.get("MPIEXEC", "mpirun")
SHARED = Path(os.environ.get("MGBENCH_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
MNIST = SHARED / "mnist"

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")

# Small, fast settings used by most tests.
# --device cpu: these CPU tests also run on GPU machines (scripts/gpu-check.sh), where auto would pick the GPU.
SMALL = ["--image-size", "32", "--width-mult", "0.25", "--threads", "1", "--progress-interval", "1000", "--device", "cpu"]


def mgbench(*args, np=None, timeout=600, check=False, wrap=()):
    """Runs mgbench (under mpirun -np when np is given; each rank through the command `wrap` when given,
    which ends by running its arguments); returns the CompletedProcess."""
    cmd = ([MPIEXEC, "-np", str(np), "--oversubscribe"] if np else []) + [*map(str, wrap), BIN, *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture
def mnist():
    if not (MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"no MNIST at {MNIST}")
    return MNIST


RANK_ENV = dict(ENV, OMP_NUM_THREADS="1")


def start(args, np=2):
    """Starts mgbench under mpirun -np without waiting (one thread per rank); returns the Popen."""
    cmd = [MPIEXEC, "-np", str(np), "--oversubscribe", BIN, *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=RANK_ENV)


def wait_for(condition, proc, timeout=120, what="the condition", interval=0.01):
    """Polls condition() until it holds; fails the test, with the run's output, when proc (a Popen)
    ends first, or after timeout seconds (killing proc)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"run ended ({proc.returncode}) before {what}:\n{out}\n{err}")
        time.sleep(interval)
    proc.kill()
    pytest.fail(f"no {what} after {timeout} s")


def wait_for_checkpoint(directory, step, proc, timeout=240):
    """Waits until checkpoint step-<step> (or a later one) is committed."""
    def committed():
        return any(int(p.rsplit("-", 1)[1]) >= step for p in glob.glob(f"{directory}/*/step-?????????"))

    wait_for(committed, proc, timeout=timeout, what=f"checkpoint {step} in {directory}", interval=0.05)


def rank_pids(proc):
    """The ranks: mpirun's child processes running mgbench."""
    out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def catches(pid, sig):
    """The process has a handler for sig (SigCgt in /proc): mgbench's main() has started."""
    try:
        with open(f"/proc/{pid}/status") as f:
            caught = int(next(line for line in f if line.startswith("SigCgt:")).split()[1], 16)
        return bool(caught & (1 << (sig - 1)))
    except (OSError, StopIteration):
        return False


def run_with_rusage(args, timeout=300):
    """Runs mgbench with args from a fresh interpreter whose only child it is; returns
    (returncode, stderr, {"maxrss_kib": peak resident memory, "minflt": minor page faults}) of it."""
    import sys
    watcher = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
               "sys.stderr.write(p.stderr); u = resource.getrusage(resource.RUSAGE_CHILDREN); "
               "print(p.returncode, u.ru_maxrss, u.ru_minflt)")
    proc = subprocess.run([sys.executable, "-c", watcher, BIN, *map(str, args)], capture_output=True, text=True,
                          env=ENV, timeout=timeout)
    returncode, peak, minflt = map(int, proc.stdout.split())
    return returncode, proc.stderr, {"maxrss_kib": peak, "minflt": minflt}


EXIT_PREEMPTED = 75  # sysexits' EX_TEMPFAIL: the batch scripts requeue on it


def preempt(args, checkpoint_dir, step, np=2):
    """Starts mgbench with args (its --checkpoint-dir being checkpoint_dir), waits for checkpoint
    `step`, sends mpirun SIGUSR1 (what `#SBATCH --signal=B:USR1@120` and the batch script's trap do),
    and checks the run stopped with exit 75. Returns its stderr."""
    proc = start(args, np=np)
    wait_for_checkpoint(checkpoint_dir, step, proc)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_PREEMPTED, err
    return err


# In CI (.ci/run sets MGBENCH_CI=1) the suite's inputs and tools are all there: a test that skips for
# want of one (MNIST, a tokenizer, an oracle, a package, ReFrame, Chromium, the test SLURM) fails
# instead, naming what was missing, so that a suite never passes CI by skipping. What no machine of
# CI's kind can do still skips there, said with not_here(reason). On a developer's machine both skip.
CI = os.environ.get("MGBENCH_CI") == "1"
NOT_HERE = "not here: "


def not_here(reason):
    """Skips the test for a reason of the machine (it runs as root, a setting of the environment), not
    for a missing input or tool: also a skip in CI."""
    pytest.skip(NOT_HERE + reason)


def _skip_reason(report):
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


def _fail_a_ci_skip(report):
    if CI and report.skipped and not hasattr(report, "wasxfail") and not _skip_reason(report).startswith(NOT_HERE):
        report.longrepr = f"skipped in CI, where every input and tool of the suite must be present: {_skip_reason(report)}"
        report.outcome = "failed"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_a_ci_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):  # a module's importorskip
    outcome = yield
    _fail_a_ci_skip(outcome.get_result())


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: needs headless Chromium (ctest label browser)")


# Exit status 77 (ctest's SKIP_RETURN_CODE) where every test that ran was skipped: ctest then shows
# the suite as skipped. A failure is never hidden: unlike a SKIP_REGULAR_EXPRESSION, which makes
# ctest report a suite whose output names one skipped test as skipped even when another failed.
EXIT_ALL_SKIPPED = 77
_outcomes = {"passed": 0, "failed": 0, "skipped": 0}


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        _outcomes[report.outcome] = _outcomes.get(report.outcome, 0) + 1


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == 0 and _outcomes["skipped"] > 0 and _outcomes["passed"] == 0 and _outcomes["failed"] == 0:
        session.exitstatus = EXIT_ALL_SKIPPED
