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


def mgbench(*args, np=None, timeout=600, check=False):
    """Runs mgbench (under mpirun -np when np is given); returns the CompletedProcess."""
    cmd = ([MPIEXEC, "-np", str(np), "--oversubscribe"] if np else []) + [BIN, *map(str, args)]
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


def wait_for_checkpoint(directory, step, proc, timeout=240):
    """Waits until checkpoint step-<step> (or a later one) is committed."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = [int(p.rsplit("-", 1)[1]) for p in glob.glob(f"{directory}/*/step-?????????")]
        if any(s >= step for s in done):
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"run ended ({proc.returncode}) before checkpoint {step}:\n{out}\n{err}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"no checkpoint {step} in {directory} after {timeout} s")


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


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: needs headless Chromium (ctest label browser)")
