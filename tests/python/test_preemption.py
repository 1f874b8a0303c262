"""Preemption and resume with real signals, as SLURM delivers them.

A run stopped by SIGUSR1 (sent to mpirun, which forwards it) or SIGTERM (sent to every rank, as
SLURM does at the time limit) exits 75 with its run marked `preempted`; `--resume` continues the same
run and ends with exactly the parameters of an uninterrupted run (fp64 / fp32 on the CPU, compared
bitwise from the final checkpoints with the safetensors package). A job killed without warning
(SIGKILL) loses only the steps since its last checkpoint and leaves earlier runs intact. Two jobs
never write one results file at once: the second is refused, naming the lock.
"""
import glob
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import (BIN, EXIT_PREEMPTED, MPIEXEC, RANK_ENV, SHARED, SMALL, catches, mgbench,  # noqa: F401
                      mnist, preempt, rank_pids, start, stopped, wait_for, wait_for_checkpoint, wait_for_hold)

h5py = pytest.importorskip("h5py")
safetensors_torch = pytest.importorskip("safetensors.torch")

IMAGE_BASE = ["image", *SMALL, "--data", SHARED / "mnist", "--limit-train", "512", "--limit-test", "256",
              "--batch-size", "32", "--precision", "fp64"]
IMAGE = [*IMAGE_BASE, "--epochs", "2"]  # 2 ranks: 8 steps per epoch, 16 in all
MODEL = Path(os.environ.get("MGBENCH_ORACLE_DIR", "")) / "llama_tiny_2256"
LLM = ["llm", "--model", MODEL, "--tokenizer", SHARED / "llama3" / "tiktoken_small.model", "--dataset", "alpaca",
       "--data", SHARED / "text" / "alpaca" / "alpaca_cleaned_first5k.json", "--limit", "400", "--batch-size", "2",
       "--max-seq-len", "1024", "--grad-accum", "2", "--max-steps", "60", "--warmup-steps", "2", "--lora-rank", "4", "--precision", "fp32",
       "--progress-interval", "1000", "--device", "cpu"]
DPO = ["llm", "--recipe", "dpo", "--model", MODEL, "--tokenizer", SHARED / "llama3" / "tiktoken_small.model",
       "--dataset", "hh_rlhf", "--data", SHARED / "text" / "dpo" / "hh_rlhf_harmless_base_test.jsonl.gz", "--limit",
       "160", "--batch-size", "2", "--grad-accum", "2", "--max-steps", "30", "--max-seq-len", "256", "--warmup-steps",
       "2", "--lr", "1e-3", "--lora-rank", "4", "--precision", "fp32", "--activation-checkpointing", "false",
       "--progress-interval", "1000", "--device", "cpu"]
def final_tensors(directory, rank):
    (latest,) = sorted(glob.glob(f"{directory}/*/step-?????????"))[-1:]
    tensors = safetensors_torch.load_file(f"{latest}/rank-{rank:05d}.safetensors")
    return {k: v for k, v in tensors.items() if k.startswith("model/")}


def open_runs(results):
    """The open file and its runs (by name: run ids start with their UTC start time)."""
    f = h5py.File(results, "r")
    return f, list(f["runs"].values())


def assert_same_parameters(a_dir, b_dir, ranks=2):
    for r in range(ranks):
        a, b = final_tensors(a_dir, r), final_tensors(b_dir, r)
        assert a.keys() == b.keys() and len(a) > 0
        for k in a:
            assert np.array_equal(a[k].numpy(), b[k].numpy()), f"rank {r}: {k} differs"


@pytest.fixture(scope="module")
def uninterrupted_image(tmp_path_factory, request):
    if not (SHARED / "mnist" / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"no MNIST at {SHARED / 'mnist'}")
    d = tmp_path_factory.mktemp("uninterrupted")
    proc = start([*IMAGE, "--checkpoint-dir", d / "ck", "--results", d / "r.h5"])
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return d


def test_checkpoint_writing_is_recorded_apart_and_left_out_of_the_run_times(tmp_path, mnist):
    """A checkpoint after every step (one rank: no peer to wait for between steps): the summary's
    checkpoint_s holds their writing, and the steps' start_s leave it out as the epochs' train_s do --
    between one step's end and the next one's start only the step's record is left (schema 14; before,
    start_s and total_s held every write while train_s did not)."""
    results = tmp_path / "r.h5"
    mgbench(*IMAGE, "--checkpoint-dir", tmp_path / "ck", "--checkpoint-every", "1", "--results", results, np=1,
            check=True)
    f, (run,) = open_runs(results)
    with f:
        summary = run["summary"][0]
        steps = run["rank_0"]["steps"][:]
        epochs = run["rank_0"]["epochs"][:]
    written = len(steps)  # one checkpoint a step
    assert written == 32 and summary["checkpoint_s"] > 0
    gaps = [b["start_s"] - a["start_s"] - a["step_s"] for a, b in zip(steps, steps[1:]) if a["epoch"] == b["epoch"]]
    assert len(gaps) == written - 2 and min(gaps) > -1e-6
    # What a checkpoint costs here (its mean) against what is left between two steps.
    assert sum(gaps) < 0.25 * summary["checkpoint_s"] * len(gaps) / written, (sum(gaps), summary["checkpoint_s"])
    # The run's time is its epochs' training and evaluation, and little else.
    between_epochs = summary["total_s"] - epochs["train_s"].sum() - epochs["eval_s"].sum()
    assert between_epochs < 0.25 * summary["checkpoint_s"], (between_epochs, summary["checkpoint_s"])
    report = subprocess.run([BIN, "report", results], capture_output=True, text=True)
    assert report.returncode == 0 and "wrote checkpoints for" in report.stdout, report.stdout + report.stderr


def test_sigusr1_to_mpirun_stops_checkpoints_and_resume_equals_uninterrupted(tmp_path, uninterrupted_image):
    ck, results = tmp_path / "ck", tmp_path / "r.h5"
    err = preempt([*IMAGE, "--checkpoint-dir", ck, "--checkpoint-every", "3", "--results", results], ck, 3)
    assert "stopped on SIGUSR1" in err
    f, runs = open_runs(results)
    with f:
        (run,) = runs
        assert run["status"][0] == b"preempted"
        steps = run["rank_0"]["steps"][:]
        done = int((steps["step_s"] > 0).sum())
        assert 3 < done < 16  # stopped after the checkpoint at step 3, well before the end
        run_id = run.attrs["run_id"]
    (manifest,) = glob.glob(f"{ck}/*/step-?????????/checkpoint.json")[-1:]
    assert '"stop_signal": "SIGUSR1"' in Path(manifest).read_text()
    # The identity: the settings that change results, and the device and backend `auto` resolved to.
    identity = json.loads(Path(manifest).read_text())["config"]
    assert "warmup-steps = 0\n" in identity and "device (resolved) = cpu\n" in identity, identity
    assert "backend (resolved) = mpi\n" in identity and "progress-interval" not in identity, identity
    report = mgbench("report", results, check=True).stdout
    assert f"# {run_id} preempted: it continues with the same options plus --resume" in report, report

    # A resume with a setting that changes results would continue another experiment: refused,
    # naming the setting, touching nothing.
    changed = mgbench(*IMAGE, "--checkpoint-dir", ck, "--resume", "--warmup-steps", "3", "--results", results, np=2)
    assert changed.returncode == 1, changed.stderr
    assert "--warmup-steps: 0 -> 3" in changed.stderr and "leave out --resume" in changed.stderr, changed.stderr
    assert "--checkpoint-every" not in changed.stderr.split("differ")[-1]  # not a setting that changes results
    f, runs = open_runs(results)
    with f:
        assert len(runs) == 1 and runs[0]["status"][0] == b"preempted"

    # --resume continues the same run in the same file, whatever --results says now, and with other
    # settings that do not change results (--checkpoint-every, --progress-interval).
    proc = mgbench(*IMAGE, "--checkpoint-dir", ck, "--resume", "--results", tmp_path / "ignored.h5",
                   "--checkpoint-every", "5", np=2)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "ignored.h5").exists()
    f, runs = open_runs(results)
    with f:
        (run,) = runs
        assert run.attrs["run_id"] == run_id and run.attrs["resumes"] == 1
        assert run["status"][0] == b"completed"
        with h5py.File(uninterrupted_image / "r.h5", "r") as g:
            (ref,) = g["runs"].values()
            for r in (0, 1):
                np.testing.assert_array_equal(run[f"rank_{r}"]["steps"]["loss"], ref[f"rank_{r}"]["steps"]["loss"])
                np.testing.assert_array_equal(run[f"rank_{r}"]["epochs"]["samples"], ref[f"rank_{r}"]["epochs"]["samples"])
                np.testing.assert_array_equal(run[f"rank_{r}"]["epochs"]["test_correct"],
                                              ref[f"rank_{r}"]["epochs"]["test_correct"])
            assert run["summary"][0]["test_accuracy"] == ref["summary"][0]["test_accuracy"]
    assert_same_parameters(ck, uninterrupted_image / "ck")
    report = mgbench("report", results, check=True).stdout
    assert f"# {run_id} resumed 1 time(s) from a checkpoint" in report, report
    csv = mgbench("report", "--csv", results, check=True).stdout.splitlines()
    assert csv[0].endswith(",resumes") and csv[1].startswith(f"{results},{run_id},completed,") and \
        csv[1].endswith(",1"), csv

    # Resuming a completed run does nothing.
    again = mgbench(*IMAGE, "--checkpoint-dir", ck, "--resume", "--results", results, np=2)
    assert again.returncode == 0 and "already completed" in again.stderr
    # A new run (no --resume) would write its checkpoints among those of the earlier run: refused.
    fresh = mgbench(*IMAGE, "--checkpoint-dir", ck, "--results", results, np=2)
    assert fresh.returncode == 1 and "already holds checkpoints of this configuration" in fresh.stderr, fresh.stderr
    f, runs = open_runs(results)
    with f:
        assert len(runs) == 1


def test_swapped_or_damaged_rank_files_are_refused_at_resume(tmp_path):
    if not (SHARED / "mnist" / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"no MNIST at {SHARED / 'mnist'}")
    ck, results = tmp_path / "ck", tmp_path / "r.h5"
    preempt([*IMAGE, "--checkpoint-dir", ck, "--checkpoint-every", "3", "--results", results], ck, 3)
    (latest,) = sorted(glob.glob(f"{ck}/*/step-?????????"))[-1:]
    rank0, rank1 = Path(latest) / "rank-00000.safetensors", Path(latest) / "rank-00001.safetensors"
    original0, original1 = rank0.read_bytes(), rank1.read_bytes()
    # Swapped: each rank would continue with the other's sampler position and records.
    rank0.write_bytes(original1)
    rank1.write_bytes(original0)
    resumed = mgbench(*IMAGE, "--checkpoint-dir", ck, "--resume", "--results", results, np=2)
    assert resumed.returncode == 1 and "was written by rank 1, not rank 0" in resumed.stderr, resumed.stderr
    # One bit flipped inside a model tensor: refused naming the file and the tensor.
    rank0.write_bytes(original0)
    rank1.write_bytes(original1)
    header_bytes = int.from_bytes(original0[:8], "little")
    header = json.loads(original0[8:8 + header_bytes])
    name = next(k for k in sorted(header) if k.startswith("model/") and header[k]["data_offsets"][1] >
                header[k]["data_offsets"][0])
    flipped = bytearray(original0)
    flipped[8 + header_bytes + header[name]["data_offsets"][0]] ^= 0x01
    rank0.write_bytes(bytes(flipped))
    resumed = mgbench(*IMAGE, "--checkpoint-dir", ck, "--resume", "--results", results, np=2)
    assert resumed.returncode == 1, resumed.stderr
    assert f"rank-00000.safetensors': tensor '{name}' fails its CRC-32 check" in resumed.stderr, resumed.stderr
    # Intact again: the run resumes and completes.
    rank0.write_bytes(original0)
    mgbench(*IMAGE, "--checkpoint-dir", ck, "--resume", "--results", results, np=2, check=True)


def test_sigkill_loses_only_the_steps_since_the_last_checkpoint(tmp_path, uninterrupted_image):
    ck, results = tmp_path / "ck", tmp_path / "r.h5"
    earlier = mgbench(*IMAGE_BASE, "--epochs", "1", "--results", results, "--run-name", "earlier", np=2)
    assert earlier.returncode == 0, earlier.stderr
    proc = start([*IMAGE, "--checkpoint-dir", ck, "--checkpoint-every", "3", "--results", results], hold_at=6)
    wait_for_hold(proc, 6)
    for pid in rank_pids(proc):  # a node failure: no signal the ranks could handle
        os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.communicate(timeout=60)
    report = subprocess.run([BIN, "report", str(results)], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr  # the file, the earlier run included, is intact
    # Stored "running", shown "aborted": no job holds the file any more (its write lock is free).
    assert re.search(r"^  \S+ +aborted ", report.stdout, re.M) and "aborted: the job ended without closing" in \
        report.stdout, report.stdout
    import mgbench_analysis as mga
    assert sorted(r.status for r in mga.read(results)) == ["aborted", "completed"]
    f, runs = open_runs(results)
    with f:
        status = sorted(r["status"][0] for r in runs)
        assert status == [b"completed", b"running"]
    proc = mgbench(*IMAGE, "--checkpoint-dir", ck, "--resume", "--results", results, np=2)
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stderr, proc.stderr
    f, runs = open_runs(results)
    with f:
        assert sorted(r["status"][0] for r in runs) == [b"completed", b"completed"]
    assert_same_parameters(ck, uninterrupted_image / "ck")


def test_a_stop_signal_right_after_launch_stops_cleanly(tmp_path):
    """SIGUSR1 to the ranks as soon as their handler exists -- the first thing main() does, before
    MPI_Init -- ends them during set-up with a message and exit 75 (nothing trained or written: no
    results file), not the default action that kills the rank. (Before main, while the dynamic loader
    maps LibTorch, nothing can catch it.)"""
    proc = start([*IMAGE, "--results", tmp_path / "r.h5"])

    deadline = time.time() + 60
    pids = []
    while time.time() < deadline and proc.poll() is None:
        pids = rank_pids(proc)
        if len(pids) == 2 and all(catches(p, signal.SIGUSR1) for p in pids):
            break
        time.sleep(0.005)
    assert len(pids) == 2, pids
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == EXIT_PREEMPTED, (proc.returncode, err[-2000:])
    assert "stopped on SIGUSR1 during set-up" in err, err[-2000:]
    assert not (tmp_path / "r.h5").exists()


@pytest.mark.parametrize("command", ["eval-only", "comm"])
def test_a_stop_signal_ends_an_evaluation_or_a_comm_run_between_batches(tmp_path, command):
    """An --eval-only run (stopped between evaluation batches) and `mgbench comm` (between sizes) stop
    on SIGUSR1 to mpirun once their run is in the results file: exit 75, the run `preempted`, comm's
    rows so far kept (was: the evaluation ran on to its end, exit 0; comm's ranks died on the signal,
    the run `aborted` with nothing recorded why)."""
    results = tmp_path / "r.h5"
    if command == "eval-only":  # 5,000 rows, some 1,250 batches a rank: seconds, every one polled
        args = [*LLM[:LLM.index("--limit")], "--limit", "5000", "--batch-size", "2", "--max-seq-len", "1024",
                "--precision", "fp32", "--device", "cpu", "--eval-only"]
    else:  # 17 sizes, the large ones seconds each
        args = ["comm", "--min-bytes", "1K", "--max-bytes", "64M", "--step-factor", "2", "--iters", "20"]
    proc = start([*args, "--results", results])
    stream = proc.stderr if command == "eval-only" else proc.stdout  # where "results: F run R" / "; results F" is
    for line in stream:
        if f"results: {results} run" in line or f"results {results} run" in line:
            break
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == EXIT_PREEMPTED, (proc.returncode, out[-2000:], err[-2000:])
    f, (run,) = open_runs(results)
    with f:
        assert run["status"][0] == b"preempted"
        if command == "comm":
            rows = run["rank_0"]["comm"][:]
            measured = int((rows["bytes"] > 0).sum()) // 2
            assert 0 < measured < 17 and f"after {measured} measured sizes" in out, out
    if command == "eval-only":
        assert "stopped on SIGUSR1 after" in err and "evaluation batches" in err and "eval loss" not in out, err[-2000:]


def test_a_stop_signal_while_the_libraries_initialise_is_a_stop_not_a_death(tmp_path):
    """SIGUSR1 to mpirun while its ranks are still in their shared libraries' initialisers (LibTorch's
    take ~0.4 s before main(); mpirun forwards the signal at once): the handlers come from the
    executable's .preinit_array, which runs before any library's initialiser, so the ranks stop during
    set-up (exit 75, the message, no results file), never by the signal's default action (exit 138,
    nothing said: the outcome, at 0.1-0.5 s after launch, while main() installed them). Made
    deterministic with a preloaded library whose initialiser stops the rank (SIGSTOP): the handler
    must already exist there; the signal is sent while the ranks are stopped and they are then
    continued. (Only the dynamic loader's mapping precedes the handlers: ~10 ms idle, more under load;
    within ~0.1 s of mpirun's start it has no rank to forward a signal to and drops it.)"""
    source = tmp_path / "stop_in_init.c"
    source.write_text("#include <signal.h>\n__attribute__((constructor)) static void stop_here(void) { raise(SIGSTOP); }\n")
    library = tmp_path / "libstop_in_init.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", library, source], check=True)
    cmd = [MPIEXEC, "-np", "2", "--oversubscribe", "-x", f"LD_PRELOAD={library}", BIN,
           *map(str, [*IMAGE, "--results", tmp_path / "r.h5"])]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=RANK_ENV)
    try:
        wait_for(lambda: len(rank_pids(proc)) == 2 and all(stopped(p) for p in rank_pids(proc)), proc, timeout=60,
                 what="both ranks stopped in a library initialiser", interval=0.01)
        pids = rank_pids(proc)
        assert all(catches(p, signal.SIGUSR1) for p in pids), "no SIGUSR1 handler before the libraries' initialisers"
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)  # mpirun forwards it: pending in the stopped ranks
    finally:
        for pid in rank_pids(proc):
            os.kill(pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == EXIT_PREEMPTED, (proc.returncode, err[-2000:])
    assert "stopped on SIGUSR1 during set-up" in err, err[-2000:]
    assert not (tmp_path / "r.h5").exists()


def test_a_stopped_rank_ends_the_job_within_the_comm_timeout(tmp_path):
    """A frozen rank (SIGSTOP: a hung node, a debugger) must not hang its peers forever: the one
    waiting in the gradient all-reduce aborts the job after --comm-timeout, its census naming the rank
    that did not answer."""
    ck = tmp_path / "ck"
    proc = start([*IMAGE_BASE, "--epochs", "200", "--comm-timeout", "5", "--checkpoint-dir", ck,
                  "--checkpoint-every", "2", "--results", tmp_path / "r.h5"])
    wait_for_checkpoint(ck, 2, proc)
    pids = rank_pids(proc)
    assert len(pids) == 2, pids
    os.kill(pids[1], signal.SIGSTOP)
    stopped = time.time()
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    elapsed = time.time() - stopped
    assert proc.returncode != 0, (out, err)
    assert "did not complete in 5 s" in err and "--comm-timeout" in err, err
    # The watchdog's census names the frozen rank, and where the waiting one is.
    assert "rank 1: no answer in 3 s (stopped, or hung outside MPI)" in err, err
    assert "rank 0: in MPI_Iallreduce #" in err, err
    # --comm-timeout, the census's window, then at most the recorder's and MPI_Abort's windows
    # (core/watchdog.h: 3, 5, 10 s) before the rank ends itself; 3 s for the launcher to see it.
    assert elapsed <= 5 + 3 + 5 + 10 + 3, elapsed


@pytest.mark.parametrize("sharding", ["fsdp", "none"])
def test_llm_sigterm_to_every_rank_then_resume_equals_uninterrupted(tmp_path, sharding):
    """Each rank's checkpoint holds its shards and their optimizer state (fsdp) or a replica (none)."""
    if not MODEL.exists():
        pytest.skip(f"no oracle model at {MODEL} (ctest runs the oracles fixture first)")
    llm = [*LLM, "--sharding", sharding]
    ref_ck = tmp_path / "ref"
    ref = mgbench(*llm, "--checkpoint-dir", ref_ck, "--results", tmp_path / "ref.h5", np=2)
    assert ref.returncode == 0, ref.stderr
    ck, results, adapters = tmp_path / "ck", tmp_path / "r.h5", tmp_path / "adapters"
    proc = start([*llm, "--checkpoint-dir", ck, "--checkpoint-every", "5", "--results", results,
                  "--output-dir", adapters], hold_at=5)
    held = wait_for_hold(proc, 5)
    for pid in rank_pids(proc):  # SLURM's time limit: SIGTERM to every task
        os.kill(pid, signal.SIGTERM)
    os.kill(held, signal.SIGCONT)  # its SIGTERM was pending while it was stopped
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_PREEMPTED, err
    # Adapters are written when the run completes, not at a stop (the folder itself is made at set-up).
    assert not list(adapters.glob("*")), list(adapters.glob("*"))
    f, runs = open_runs(results)
    with f:
        assert runs[0]["status"][0] == b"preempted"
    changed = mgbench(*llm, "--checkpoint-dir", ck, "--resume", "--lora-dropout", "0.1", "--results", results, np=2)
    assert changed.returncode == 1 and "--lora-dropout: 0 -> 0.1" in changed.stderr, changed.stderr
    # Without --checkpoint-every 5: how often checkpoints are written does not change results.
    proc = mgbench(*llm, "--checkpoint-dir", ck, "--resume", "--results", results, "--output-dir", adapters, np=2)
    assert proc.returncode == 0, proc.stderr
    assert (adapters / "adapter_model.safetensors").exists()
    assert_same_parameters(ck, ref_ck)
    f, runs = open_runs(results)
    with f:
        assert len(runs) == 1 and runs[0]["status"][0] == b"completed"
        with h5py.File(tmp_path / "ref.h5", "r") as g:
            (r,) = g["runs"].values()
            np.testing.assert_array_equal(runs[0]["rank_0"]["steps"]["loss"], r["rank_0"]["steps"]["loss"])


def test_dpo_sigusr1_then_resume_equals_uninterrupted_with_its_metrics(tmp_path):
    if not MODEL.exists():
        pytest.skip(f"no oracle model at {MODEL} (ctest runs the oracles fixture first)")
    ref = mgbench(*DPO, "--checkpoint-dir", tmp_path / "ref", "--results", tmp_path / "ref.h5", np=2)
    assert ref.returncode == 0, ref.stderr
    ck, results = tmp_path / "ck", tmp_path / "r.h5"
    preempt([*DPO, "--checkpoint-dir", ck, "--checkpoint-every", "4", "--results", results], ck, 4)
    proc = mgbench(*DPO, "--checkpoint-dir", ck, "--resume", "--results", results, np=2)
    assert proc.returncode == 0, proc.stderr
    assert_same_parameters(ck, tmp_path / "ref")
    f, runs = open_runs(results)
    with f, h5py.File(tmp_path / "ref.h5", "r") as g:
        (r,) = g["runs"].values()
        assert len(runs) == 1 and runs[0]["status"][0] == b"completed" and runs[0].attrs["resumes"] == 1
        for rank in (0, 1):
            # The step losses and the recipe's metrics, those before the stop restored from the checkpoint.
            np.testing.assert_array_equal(runs[0][f"rank_{rank}"]["steps"]["loss"], r[f"rank_{rank}"]["steps"]["loss"])
            np.testing.assert_array_equal(runs[0][f"rank_{rank}"]["metrics"][:], r[f"rank_{rank}"]["metrics"][:])


def test_resume_with_another_number_of_ranks_is_refused(tmp_path):
    if not (SHARED / "mnist" / "train-images-idx3-ubyte.gz").exists():
        pytest.skip("no MNIST")
    ck = tmp_path / "ck"
    preempt([*IMAGE, "--checkpoint-dir", ck, "--checkpoint-every", "2", "--results", tmp_path / "r.h5"], ck, 2)
    bad = mgbench(*IMAGE, "--checkpoint-dir", ck, "--resume", "--results", tmp_path / "r.h5", np=3)
    assert bad.returncode == 1
    assert "written by 2 rank(s); resume with the same number of ranks, not 3" in bad.stderr


def test_a_checkpoint_names_its_results_file_by_an_absolute_path(tmp_path):
    """Given relative paths, the manifest's results file was relative to the first run's directory: a
    --resume from another directory failed ("results file 'r.h5' of the run to resume does not exist")."""
    if not (SHARED / "mnist" / "train-images-idx3-ubyte.gz").exists():
        pytest.skip("no MNIST")
    here = tmp_path / "first"
    here.mkdir()
    args = [*IMAGE_BASE, "--epochs", "1", "--checkpoint-dir", "ck", "--checkpoint-every", "4", "--results", "r.h5"]
    proc = subprocess.run(list(map(str, [BIN, *args])), cwd=here, capture_output=True, text=True, env=RANK_ENV,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    manifests = glob.glob(f"{here}/ck/*/step-*/checkpoint.json")
    assert manifests and {json.loads(Path(m).read_text())["results"] for m in manifests} == {str(here / "r.h5")}


def test_checkpoint_options_need_a_directory():
    proc = mgbench(*IMAGE, "--resume")
    assert proc.returncode == 2 and "--checkpoint-dir" in proc.stderr


def test_two_jobs_on_one_results_file_the_second_is_refused_and_nothing_is_corrupted(tmp_path, mnist):
    results = tmp_path / "shared.h5"
    first = start([*IMAGE, "--checkpoint-dir", tmp_path / "ck", "--checkpoint-every", "1", "--results", results],
                  hold_at=1)
    held = wait_for_hold(first, 1)  # the first job has the file open, and keeps it while held
    try:
        second = mgbench(*IMAGE_BASE, "--epochs", "1", "--results", results, np=2)
    finally:
        os.kill(held, signal.SIGCONT)
    assert second.returncode == 1
    assert "is being written by another job" in second.stderr and "shared.h5.lock" in second.stderr, second.stderr
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    # One job after the other: runs append to the one file.
    third = mgbench(*IMAGE_BASE, "--epochs", "1", "--results", results, np=2)
    assert third.returncode == 0, third.stderr
    f, runs = open_runs(results)
    with f:
        assert [r["status"][0] for r in runs] == [b"completed", b"completed"]
