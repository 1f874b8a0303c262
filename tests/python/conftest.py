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


def start(args, np=2, hold_at=None, env=None):
    """Starts mgbench under mpirun -np without waiting (one thread per rank); returns the Popen.
    hold_at: the rank that commits the run's first checkpoint at or after this global step stops
    itself there (SIGSTOP, from a preloaded library: hold_library), so that what the test does next
    -- a signal, a kill, a second job -- lands at that step however fast the machine runs the steps
    after it (polling the directory for the checkpoint raced the run's end on a slow or busy machine).
    wait_for_hold gives its pid; SIGCONT continues it. env: variables the ranks get besides RANK_ENV."""
    hold = ["-x", f"LD_PRELOAD={hold_library()}", "-x", "MGBENCH_TEST_HOLD_STEP"] if hold_at is not None else []
    cmd = [MPIEXEC, "-np", str(np), "--oversubscribe", *hold, BIN, *map(str, args)]
    env = dict(RANK_ENV, **(env or {}), **({"MGBENCH_TEST_HOLD_STEP": str(hold_at)} if hold_at is not None else {}))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


# rename(2) interposed: the checkpointer's rank 0 commits step N by renaming step-<9 digits>.partial
# to step-<9 digits> (modules/train/checkpoint/checkpointer.cpp); once, at the first N at or after
# MGBENCH_TEST_HOLD_STEP, the process stops itself after the rename. MGBENCH_TEST_HOLD_ONCE (a path):
# once for every process of the environment -- a requeued batch job's resumed ranks included --, the
# first to hold creating the file, none holding where it exists.
HOLD_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int rename(const char* from, const char* to) {
  static int (*real)(const char*, const char*);
  static int held;
  if (real == NULL) real = (int (*)(const char*, const char*))dlsym(RTLD_NEXT, "rename");
  const int rc = real(from, to);
  const char* step = getenv("MGBENCH_TEST_HOLD_STEP");
  const char* slash = strrchr(to, '/');
  const char* name = slash != NULL ? slash + 1 : to;
  if (rc == 0 && !held && step != NULL && strncmp(name, "step-", 5) == 0 && strlen(name) == 14 &&
      strspn(name + 5, "0123456789") == 9 && atol(name + 5) >= atol(step)) {
    held = 1;
    const char* once = getenv("MGBENCH_TEST_HOLD_ONCE");
    const int fd = once != NULL ? open(once, O_CREAT | O_EXCL | O_WRONLY, 0644) : -1;
    if (fd >= 0) close(fd);
    if (once == NULL || fd >= 0) raise(SIGSTOP);
  }
  return rc;
}
"""
_hold_library = []


def hold_library():
    """The preloaded library of start(hold_at=...), compiled once per test process."""
    if not _hold_library:
        import atexit
        import shutil
        import tempfile
        directory = Path(tempfile.mkdtemp(prefix="mgbench-hold-"))
        atexit.register(shutil.rmtree, directory, True)
        (directory / "hold.c").write_text(HOLD_SOURCE)
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", directory / "libhold.so", directory / "hold.c", "-ldl"],
                       check=True)
        _hold_library.append(directory / "libhold.so")
    return _hold_library[0]


def stopped(pid):
    """The process is stopped (state T)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def pending(pid, sig):
    """sig is pending for the process (ShdPnd or SigPnd in /proc): sent, not yet delivered."""
    try:
        with open(f"/proc/{pid}/status") as f:
            masks = [int(line.split()[1], 16) for line in f if line.startswith(("ShdPnd:", "SigPnd:"))]
        return any(mask & (1 << (sig - 1)) for mask in masks)
    except OSError:
        return False


def wait_for_hold(proc, step, timeout=240):
    """The pid of the rank of start(..., hold_at=step) stopped after committing that checkpoint."""
    held = []

    def holds():
        held[:] = [pid for pid in rank_pids(proc) if stopped(pid)]
        return bool(held)

    wait_for(holds, proc, timeout=timeout, what=f"a rank held at checkpoint {step}", interval=0.02)
    return held[0]


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


def checkpoint_steps(directory):
    """The global steps of the checkpoints committed in a --checkpoint-dir."""
    return [int(p.rsplit("-", 1)[1]) for p in glob.glob(f"{directory}/*/step-?????????")]


def wait_for_checkpoint(directory, step, proc, timeout=240):
    """Waits until checkpoint step-<step> (or a later one) is committed. The run goes on meanwhile:
    where the test must act at that step, start(..., hold_at=step) and wait_for_hold."""
    wait_for(lambda: max(checkpoint_steps(directory), default=-1) >= step, proc, timeout=timeout,
             what=f"checkpoint {step} in {directory}", interval=0.05)


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
    and checks the run stopped with exit 75. Returns its stderr. The rank that commits the checkpoint
    is held there (start's hold_at) until mpirun has forwarded the signal to it: the stop comes at
    the next step boundaries, never after a run that finished first."""
    proc = start(args, np=np, hold_at=step)
    held = wait_for_hold(proc, step)
    assert max(checkpoint_steps(checkpoint_dir), default=-1) >= step, f"no checkpoint {step} in {checkpoint_dir}"
    proc.send_signal(signal.SIGUSR1)
    try:
        wait_for(lambda: pending(held, signal.SIGUSR1), proc, timeout=60, what="SIGUSR1 forwarded to the held rank")
    finally:
        os.kill(held, signal.SIGCONT)
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
        report.longrepr = (f"skipped in CI, where every input and tool of the suite must be present (the inputs: "
                           f"scripts/get-test-data.sh): {_skip_reason(report)}")
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
