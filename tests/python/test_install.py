"""`cmake --install` and the Lmod module (issue 29): the install tree of this build, loaded with
Debian's Lmod from another directory -- `mgbench --version`, a 2-rank run, `mgbench-report`,
`mgbench-plot`, the sbatch scripts under $MGBENCH_SHARE -- and again after the tree has moved (the
modulefile finds its prefix from its own path)."""
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, ENV, SMALL

LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
BUILD = Path(BIN).resolve().parents[1]


def in_module_shell(modules, script, cwd):
    """Runs `script` in bash after `module use MODULES; module load mgbench`."""
    text = f"source {LMOD_INIT}\nmodule use {modules}\nmodule load mgbench || exit 9\n{script}"
    return subprocess.run(["bash", "-c", text], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=600)


@pytest.mark.skipif(not LMOD_INIT.exists(), reason="no Lmod (scripts/install-deps.sh installs Debian's lmod)")
def test_the_install_tree_loads_as_a_module_and_runs_from_anywhere(tmp_path, mnist):
    prefix = tmp_path / "prefix"
    done = subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    version = subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout.strip()
    modulefile = next((prefix / "modulefiles" / "mgbench").glob("*.lua"))
    assert version.startswith(f"mgbench {modulefile.stem} ")
    work = tmp_path / "elsewhere"
    work.mkdir()
    run = " ".join(map(str, ["mgbench", "image", "--data", mnist, *SMALL, "--limit-train", "128", "--limit-test", "32",
                             "--epochs", "1", "--batch-size", "32", "--results", "r.h5"]))
    script = f"""set -e
command -v mgbench mgbench-report mgbench-plot
echo "share=$MGBENCH_SHARE"
mgbench --version
mgbench-report --version
mpirun -np 2 --oversubscribe {run} >run.log 2>&1
mgbench-report r.h5
mgbench-plot r.h5 --out figures
test -x "$MGBENCH_SHARE/slurm/image.sbatch" && test -f "$MGBENCH_SHARE/slurm/common.sh"
"""
    proc = in_module_shell(prefix / "modulefiles", script, work)
    assert proc.returncode == 0, proc.stdout + proc.stderr + (work / "run.log").read_text(errors="replace")
    lines = proc.stdout.splitlines()
    assert lines[:3] == [str(prefix / "bin" / n) for n in ("mgbench", "mgbench-report", "mgbench-plot")]
    assert f"share={prefix / 'share' / 'mgbench'}" in lines and version in lines
    assert "mgbench-report" + version[len("mgbench"):] in lines, proc.stdout
    assert any(line.startswith("  ") and " completed " in line for line in lines), proc.stdout
    assert (work / "figures" / "phase_breakdown.png").stat().st_size > 0
    # Moved: the modulefile finds the new prefix.
    moved = tmp_path / "moved"
    shutil.move(str(prefix), str(moved))
    proc = in_module_shell(moved / "modulefiles", "command -v mgbench && mgbench --version", work)
    assert proc.returncode == 0 and proc.stdout.splitlines() == [str(moved / "bin" / "mgbench"), version], proc.stdout
