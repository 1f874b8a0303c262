"""The ReFrame checks (reframe/): under the local launcher and under the test SLURM cluster
(tests/slurm/cluster.sh), the nightly checks pass against this machine's references and the check
with an unreachable reference fails, as a centre's regression run must (issue 29)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BIN, ENV, SHARED
from test_slurm import slurm  # noqa: F401 (the fixture: a one-node SLURM)

ROOT = Path(__file__).resolve().parents[2]
REFRAME = Path(sys.executable).parent / "reframe"  # reframe-hpc beside this interpreter (the venv)
MODEL = Path(os.environ.get("MGBENCH_ORACLE_DIR", "")) / "llama_tiny_2256"


def reframe(config, tags, prefix, env, cwd):
    cmd = [str(REFRAME), "-C", str(ROOT / "reframe" / "config" / config), "-c", str(ROOT / "reframe" / "checks"),
           "-r", "-t", tags, "--prefix", str(prefix), "--nocolor"]
    env = dict(env, MGBENCH=BIN, MGBENCH_SHARED_DATA=str(SHARED), MGBENCH_LLM_MODEL=str(MODEL))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=900)


def check_both_ways(config, env, tmp_path):
    nightly = reframe(config, "nightly", tmp_path / "nightly", env, tmp_path)
    assert nightly.returncode == 0, nightly.stdout[-4000:] + nightly.stderr[-2000:]
    assert re.search(r"PASSED .*Ran 3/3 test case\(s\) from 3 check\(s\) \(0 failure", nightly.stdout), nightly.stdout
    for name in ("img_per_s_per_rank", "s_per_epoch", "tokens_per_s", "busbw"):
        assert re.search(rf"P: {name}: [\d.]+ ", nightly.stdout), (name, nightly.stdout[-3000:])
    unreachable = reframe(config, "unreachable", tmp_path / "unreachable", env, tmp_path)
    assert unreachable.returncode != 0, unreachable.stdout[-3000:]
    assert "failed to meet reference(s): img_per_s_per_rank=" in unreachable.stdout, unreachable.stdout[-3000:]


@pytest.fixture
def requirements(mnist):
    if not REFRAME.exists():
        pytest.skip(f"no ReFrame at {REFRAME} (scripts/install-deps.sh installs reframe-hpc)")
    if not MODEL.exists():
        pytest.skip(f"no tiny Llama oracle at {MODEL}")


def test_checks_under_the_local_launcher(tmp_path, requirements):
    check_both_ways("local.py", ENV, tmp_path)


def test_checks_under_slurm(tmp_path, requirements, slurm):  # noqa: F811
    check_both_ways("slurm.py", slurm, tmp_path)
