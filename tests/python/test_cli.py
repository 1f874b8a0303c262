"""Bad input ends with a clear message naming the option or file, and a non-zero exit."""
import gzip
import shutil
import subprocess

import h5py
import pytest

from conftest import BIN, ENV, MPIEXEC, SMALL, mgbench, not_here, run_with_rusage


@pytest.mark.parametrize("args, needle", [
    (["--strategy", "fsdp"], "--strategy 'fsdp'"),
    (["--device", "tpu"], "--device 'tpu'"),
    (["--backend", "gloo"], "--backend 'gloo'"),
    (["--upscale", "gpu"], "--upscale 'gpu'"),
    (["--profile-window", "720"], "--profile-window '720'"),
    (["--precision", "fp8"], "--precision 'fp8'"),
    (["--batch-size", "0"], "--batch-size '0': expected >= 1"),
    (["--epochs", "abc"], "--epochs 'abc': expected an integer"),
    (["--image-size", "-5"], "--image-size '-5': expected >= 1"),
    (["--lr", "1e400"], "--lr '1e400': expected a finite number"),
    # Past float32, which the optimizers' kernels take (the run failed at its first step, the option unnamed).
    (["--lr", "1e300", "--dry-run"], "--lr '1e+300': expected <= "),
    (["--pin-memory", "maybe"], "--pin-memory 'maybe': expected true or false"),
    (["--recipe", "lora"], "--recipe 'lora': expected classification"),
    (["--no-such-option"], "no-such-option"),
    (["--config", "/nonexistent.ini"], "/nonexistent.ini"),
    (["--threads", "100000"], "--threads '100000': expected <= "),
    (["--bucket-mb", "1e-300"], "--bucket-mb '1e-300': expected >= "),
    (["--first-bucket-mb", "1e15"], "--first-bucket-mb '1000000000000000': expected <= 1048576"),
    # A fact of the model's row, checked with the options (was: --dry-run passed, the run exited 1).
    (["--model", "resnet50", "--width-mult", "0.5", "--dry-run"], "--width-mult 0.5: resnet50 has torchvision's fixed"),
    # An option the run has no use for (was: silently ignored), refused with --dry-run too.
    (["--crop", "center", "--dry-run"], "--crop 'center': only with --dataset imagefolder or webdataset"),
    # ... typed on the command line at its default too (was: passed silently); a config file's
    # default passes (test_config_file_and_command_line_override: a resolved configuration lists all).
    (["--crop", "random", "--dry-run"], "--crop 'random': only with --dataset imagefolder"),
    (["--reshard-after-forward", "false"], "--reshard-after-forward 'false': only with --sharding fsdp"),
    # A value after a switch, or a stray word, is an error, not silently dropped.
    (["--record-indices", "true"], "'true': unexpected"),
    (["--data", "d", "extra"], "'extra': unexpected (every option is --name"),
])
def test_bad_options_exit_2_naming_the_option(args, needle):
    proc = mgbench("image", *args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr, proc.stderr


def test_bad_option_under_mpirun_reports_once(tmp_path):
    proc = mgbench("image", "--strategy", "nope", np=2)
    assert proc.returncode != 0
    assert proc.stderr.count("--strategy 'nope'") == 1, proc.stderr


def test_bad_config_file_key(tmp_path):
    ini = tmp_path / "bad.ini"
    ini.write_text("epochs = 2\ncolour = blue\n")
    proc = mgbench("image", "--config", ini)
    assert proc.returncode == 2
    assert "colour" in proc.stderr and str(ini) in proc.stderr
    # A directory is not a configuration (it once ran with the defaults), nor is an include.
    proc = mgbench("image", "--config", tmp_path)
    assert proc.returncode == 2 and "a directory, not a regular file" in proc.stderr and "expected an INI file" in proc.stderr, proc.stderr
    nested = tmp_path / "nested.ini"
    nested.write_text(f"epochs = 2\nconfig = {ini}\n")
    proc = mgbench("image", "--config", nested)
    assert proc.returncode == 2 and "the key 'config'" in proc.stderr and str(nested) in proc.stderr, proc.stderr


def test_config_file_and_command_line_override(tmp_path):
    ini = tmp_path / "c.ini"
    ini.write_text("epochs = 7\nbatch-size = 16\ncrop = random\n")
    proc = mgbench("image", "--config", ini, "--epochs", "3", "--dry-run", check=True)
    assert "epochs = 3" in proc.stdout and "batch-size = 16" in proc.stdout


def test_steps_that_leave_data_or_warm_up_undone_are_warned_of(tmp_path, mnist):
    """160 samples over 2 ranks at batch 16 are 5 micro-batches a rank: --grad-accum 2 makes 2 steps and
    never trains on the fifth; a warm-up of 1000 steps never reaches --lr. Both warned of, once, by
    rank 0 (were silent: 20 % of the data left out, the run trained at lr <= 5e-8)."""
    proc = mgbench("image", "--data", mnist, *SMALL, "--limit-train", "160", "--limit-test", "32", "--epochs", "1",
                   "--batch-size", "16", "--grad-accum", "2", "--lr", "0.05", "--warmup-steps", "1000",
                   "--results", tmp_path / "r.h5", np=2, check=True)
    assert proc.stderr.count("--grad-accum 2: each epoch's 5 micro-batches per rank make 2 optimizer step(s), and "
                             "its last 1 are not trained on") == 1, proc.stderr
    assert proc.stderr.count("--warmup-steps 1000 at or past the run's 2 optimizer steps: the learning rate never "
                             "reaches --lr 0.05 (it ends at 5e-05)") == 1, proc.stderr
    quiet = mgbench("image", "--data", mnist, *SMALL, "--limit-train", "128", "--limit-test", "32", "--epochs", "1",
                    "--batch-size", "16", "--grad-accum", "2", "--results", tmp_path / "q.h5", np=2, check=True)
    assert "--grad-accum" not in quiet.stderr and "--warmup-steps" not in quiet.stderr, quiet.stderr


def test_ranks_started_with_other_results_files_are_refused_at_once(tmp_path, mnist):
    """An MPMD launch whose ranks name other --results: refused before either file is created (each
    rank waited in the other file's collective creation until --comm-timeout, 600 s, leaving an empty
    file that later runs refused)."""
    rank = [BIN, "image", "--data", mnist, *SMALL, "--limit-train", "64", "--limit-test", "32", "--epochs", "1"]
    cmd = [MPIEXEC, "-np", "1", *rank, "--results", tmp_path / "a.h5", ":", "-np", "1", *rank, "--results",
           tmp_path / "b.h5"]
    proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode != 0, proc.stderr
    assert f"the ranks name other results files (rank 0: '{tmp_path / 'a.h5'}')" in proc.stderr, proc.stderr
    assert not (tmp_path / "a.h5").exists() and not (tmp_path / "b.h5").exists()


def test_missing_data_directory(tmp_path):
    proc = mgbench("image", "--data", tmp_path / "absent", *SMALL, "--results", tmp_path / "r.h5", np=2)
    assert proc.returncode != 0
    assert "absent" in proc.stderr and "does not exist" in proc.stderr
    assert not (tmp_path / "r.h5").exists()
    # A file given for the directory: said so (was: "does not exist").
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"")
    proc = mgbench("image", "--data", tmp_path / "train-images-idx3-ubyte.gz", *SMALL, "--results", tmp_path / "r.h5",
                   np=1)
    assert proc.returncode != 0 and "a file, not a directory" in proc.stderr and "does not exist" not in proc.stderr, \
        proc.stderr


def test_corrupt_and_truncated_files(tmp_path, mnist):
    for name in ("train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(mnist / name, tmp_path / name)
    raw = gzip.decompress((mnist / "train-images-idx3-ubyte.gz").read_bytes())
    (tmp_path / "train-images-idx3-ubyte").write_bytes(raw[: len(raw) // 2])  # truncated, uncompressed
    proc = mgbench("image", "--data", tmp_path, *SMALL, "--results", tmp_path / "r.h5", np=2)
    assert proc.returncode != 0
    assert "train-images-idx3-ubyte" in proc.stderr and "truncated" in proc.stderr
    (tmp_path / "train-images-idx3-ubyte").unlink()
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b garbage that is not deflate data" * 10)
    proc = mgbench("image", "--data", tmp_path, *SMALL, "--results", tmp_path / "r.h5")
    assert proc.returncode != 0
    assert "train-images-idx3-ubyte.gz" in proc.stderr


def test_an_idx_header_is_not_trusted_for_the_allocation(tmp_path, mnist):
    import struct
    for name in ("train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(mnist / name, tmp_path / name)
    # 1,000 images of data under a header announcing 4,000,000 (3.1 GB): truncated, read as it comes.
    header = struct.pack(">IIII", 0x803, 4_000_000, 28, 28)
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(header + bytes(1000 * 28 * 28)))
    returncode, stderr, usage = run_with_rusage(["image", "--data", tmp_path, *SMALL, "--results", tmp_path / "r.h5"])
    assert returncode != 0
    assert "train-images-idx3-ubyte.gz: truncated: header announces 3136000000 data bytes (4000000 x 28 x 28), " \
        "file holds 784000" in stderr, stderr
    assert usage["maxrss_kib"] < 2 * 1024 * 1024, usage  # not the 3 GB the header asks for


def test_train_and_test_images_of_different_sizes_are_refused(tmp_path, mnist):
    import struct
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        shutil.copy(mnist / name, tmp_path / name)
    # A 10-image test set of 14x14 images next to 28x28 training images.
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 0x803, 10, 14, 14) + bytes(10 * 14 * 14))
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x801, 10) + bytes(10))
    proc = mgbench("image", "--data", tmp_path, *SMALL, "--results", tmp_path / "r.h5", np=2)
    assert proc.returncode != 0
    assert "28x28" in proc.stderr and "14x14" in proc.stderr and "t10k-images-idx3-ubyte" in proc.stderr, proc.stderr


def test_results_path_that_is_not_hdf5_is_left_alone(tmp_path, mnist):
    target = tmp_path / "notes.h5"
    target.write_text("my notes")
    proc = mgbench("image", "--data", mnist, *SMALL, "--limit-train", "64", "--limit-test", "32",
                   "--epochs", "1", "--results", target, np=2)
    assert proc.returncode != 0
    assert "not an HDF5 file" in proc.stderr
    assert target.read_text() == "my notes"
    # Nor is a lock file left beside it (was: notes.h5.lock stayed, as after a --resume whose file was gone).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.h5"]
    # A directory: said so (was "exists and is not an HDF5 file").
    proc = mgbench("image", "--data", mnist, *SMALL, "--limit-train", "64", "--limit-test", "32",
                   "--epochs", "1", "--results", tmp_path, np=1)
    assert proc.returncode != 0 and f"results file '{tmp_path}' is a directory" in proc.stderr, proc.stderr


def test_report_errors(tmp_path):
    assert mgbench("report").returncode == 2
    proc = mgbench("report", tmp_path / "absent.h5")
    assert proc.returncode == 1 and "absent.h5" in proc.stderr
    proc = mgbench("report", str(tmp_path / "nothing-*.h5"))
    assert proc.returncode == 1 and "no file matches" in proc.stderr and "nothing-*.h5" in proc.stderr
    # A directory without results files fails as a pattern matching nothing does (issue 16).
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    proc = mgbench("report", tmp_path / "empty")
    assert proc.returncode == 1 and "no results file (*.h5) below" in proc.stderr, proc.stderr
    # The text breakdowns are no CSV (their lines followed the rows, and a CSV reader took them for rows).
    for breakdown in ("--phases", "--cuda"):
        proc = mgbench("report", "--csv", breakdown, tmp_path / "absent.h5")
        assert proc.returncode == 2 and f"--csv with {breakdown}" in proc.stderr, proc.stderr
    # --tolerance without --reference, and the report's extras with it (--reference prints its comparison
    # alone): refused (were ignored, exit 0).
    proc = mgbench("report", "--tolerance", "5", tmp_path / "absent.h5")
    assert proc.returncode == 2 and "--tolerance '5': only with --reference" in proc.stderr, proc.stderr
    for extra in (["--phases"], ["--cuda"], ["--energy"], ["--paper"], ["--plot", tmp_path / "figs"]):
        proc = mgbench("report", "--reference", tmp_path / "a.h5", *extra, tmp_path / "b.h5")
        assert proc.returncode == 2 and f"{extra[0]} '" in proc.stderr and "only with a report (not with --reference)" \
            in proc.stderr, proc.stderr
    assert not (tmp_path / "figs").exists()
    assert mgbench("unknown-command").returncode == 2


def test_data_names_its_subcommands():
    # Was: anything but read-images / make-images first read as `stats` ("ACTION 'frobnicate': expected
    # stats"), and `data --help` showed stats' usage alone.
    for args in (["frobnicate"], ["--data", "d", "make-images"], []):
        proc = mgbench("data", *args)
        assert proc.returncode == 2 and "expected a subcommand first: stats, make-images or read-images" \
            in proc.stderr, proc.stderr
    proc = mgbench("data", "--help")
    assert proc.returncode == 0 and all(f"mgbench data {s}" in proc.stdout for s in ("stats", "make-images",
                                                                                    "read-images")), proc.stdout


def test_report_names_the_object_at_fault(tmp_path):
    h5py = pytest.importorskip("h5py")
    import numpy as np
    broken = tmp_path / "broken.h5"
    with h5py.File(broken, "w") as f:  # an mgbench file whose run has a rank_0 that is not a group
        f.attrs["schema"], f.attrs["schema_version"] = "mgbench-results", np.int64(4)
        run = f.create_group("runs/r1")
        run.create_dataset("status", data=np.array([b"completed"], dtype=h5py.string_dtype("utf-8", 16)))
        run.create_dataset("rank_0", data=np.zeros(3))
    proc = mgbench("report", broken)
    assert proc.returncode == 1 and "/runs/r1/rank_0" in proc.stderr and "broken.h5" in proc.stderr, proc.stderr


def test_report_names_an_unreadable_directory():
    """A directory the user may not read is named, exit 1. Root reads every directory: as root the
    report runs as nobody (setpriv), its LibTorch-free binary (the venv's libraries lie below /root),
    the same directory walk as `mgbench report`'s."""
    import os
    import subprocess
    import tempfile
    from pathlib import Path
    command = [BIN, "report"]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            not_here("root reads every directory, and setpriv (util-linux) is missing to drop root")
        command = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
                   str(Path(BIN).parent / "mgbench-report")]
    base = Path(tempfile.mkdtemp(prefix="mgbench-unreadable-"))  # not below pytest's 0700 base: nobody walks it
    try:
        base.chmod(0o755)
        locked = base / "runs" / "locked"
        locked.mkdir(parents=True)
        (locked / "r.h5").write_text("x")
        locked.chmod(0)
        proc = subprocess.run([*command, str(base / "runs")], capture_output=True, text=True, timeout=60, env=ENV)
        locked.chmod(0o755)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert proc.returncode == 1 and "cannot read below" in proc.stderr and "locked" in proc.stderr, proc.stderr


def test_every_shipped_config_is_valid():
    from pathlib import Path
    configs = sorted((Path(__file__).resolve().parents[2] / "inputs" / "configs").rglob("*.ini"))
    assert configs, "no config files found"
    for ini in configs:
        # A recipe's defaults (recipes/) start with the command that runs them: "# mgbench llm --recipe dpo: ...".
        words = ini.read_text().splitlines()[0].split(":")[0].split()
        command = words[2:] if ini.parent.name == "recipes" else ["image"]
        assert ini.parent.name != "recipes" or words[:2] == ["#", "mgbench"], f"{ini}: no command on its first line"
        # --dry-run plans without reading input: an llm recipe's --data may be left out.
        proc = mgbench(*command, "--config", ini, "--dry-run")
        assert proc.returncode == 0, f"{ini}: {proc.stderr}"
        if command[0] == "llm":
            ran = mgbench(*command, "--config", ini)
            assert ran.returncode == 2 and "--data: required" in ran.stderr, f"{ini}: {ran.stderr}"


def test_shell_scripts_parse():
    import subprocess
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    scripts = (sorted((root / "scripts").glob("*.sh")) + sorted((root / "slurm").glob("*.sbatch")) +
               sorted((root / "slurm").glob("*.sh")) + sorted((root / "tests" / "slurm").glob("*.sh")) +
               [root / ".ci" / "run"])
    for script in scripts:
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, script
    for sbatch in sorted((root / "slurm").glob("*.sbatch")):
        outside = subprocess.run(["bash", str(sbatch)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
        assert outside.returncode == 2 and "not inside a SLURM allocation" in outside.stderr, sbatch


def test_unusable_results_directory_fails_promptly_on_all_ranks(tmp_path, mnist):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = mgbench("image", "--data", mnist, *SMALL, "--limit-train", "64", "--limit-test", "32", "--epochs", "1",
                   "--results", blocker / "sub" / "r.h5", np=2, timeout=60)  # hung before the fix
    assert proc.returncode != 0
    assert "creating the results directory failed" in proc.stderr and "a-file" in proc.stderr


def test_more_threads_than_the_rank_may_run_on_is_said(tmp_path, mnist):
    # Open MPI binds each rank to one core when np <= 2: two threads would share it.
    proc = mgbench("image", "--image-size", "32", "--width-mult", "0.25", "--threads", "2", "--device", "cpu", "--data",
                   mnist, "--limit-train", "64", "--limit-test", "32", "--epochs", "1", "--results", tmp_path / "r.h5",
                   np=2)
    assert proc.returncode == 0, proc.stderr
    assert "--threads 2: this rank may run on 1 core(s) only" in proc.stderr, proc.stderr


def test_cuda_graphs_on_where_they_cannot_be_used_is_refused_naming_why(tmp_path, mnist):
    """--cuda-graphs on (issue 47) is an error, on every rank alike, where a capture could not hold the
    step: a CPU rank, several ranks; auto records why it ran eagerly (the run attribute)."""
    small = ["--image-size", "32", "--width-mult", "0.25", "--device", "cpu", "--data", mnist, "--limit-train", "64",
             "--limit-test", "32", "--epochs", "1"]
    proc = mgbench("image", *small, "--cuda-graphs", "on", "--results", tmp_path / "r.h5")
    assert proc.returncode == 1, proc.stderr
    assert "--cuda-graphs on: the rank computes on the CPU" in proc.stderr, proc.stderr
    proc = mgbench("image", *small, "--cuda-graphs", "on", "--results", tmp_path / "r2.h5", np=2)
    assert proc.returncode == 1 and proc.stderr.count("--cuda-graphs on:") == 1, proc.stderr
    mgbench("image", *small, "--results", tmp_path / "auto.h5", check=True)
    with h5py.File(tmp_path / "auto.h5", "r") as f:
        (run,) = f["runs"].values()
        assert run.attrs["cuda_graphs"] == "auto"
        assert run.attrs["cuda_graphs_decision"] == "off: the rank computes on the CPU (CUDA graphs replay GPU work)"
