"""Resume at another number of ranks (--global-batch-size): a run stopped at 2 ranks continues at 3,
stops again and ends at 2, each rank's state put together from the other world size's rank files
(FSDP's shards and their AdamW state cut anew, as torch.distributed.checkpoint reshards FSDP2's
DTensors). Every optimizer step takes the same global batch of the same samples at any world size
(DistributedSampler's order, the micro-batches per step following the ranks), so the run ends with
the parameters of an uninterrupted 2-rank run up to the order of the gradient sums (fp32: within
1e-5), each epoch computes every sample exactly once across the runs, and the learning rate follows
one schedule. Each world size is a run of its own in the results file, linked to the one it continues.
"""
import glob
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED, SMALL, mgbench, mnist, preempt  # noqa: F401

h5py = pytest.importorskip("h5py")
safetensors_torch = pytest.importorskip("safetensors.torch")

MODEL = Path(os.environ.get("MGBENCH_ORACLE_DIR", "")) / "llama_tiny_2256"
# 240 samples, 12 a step: 20 steps an epoch at 2 ranks (6 micro-batches each) and at 3 (4 each).
LLM = ["llm", "--model", MODEL, "--tokenizer", SHARED / "llama3" / "tiktoken_small.model", "--dataset", "alpaca",
       "--data", SHARED / "text" / "alpaca" / "alpaca_cleaned_first5k.json", "--limit", "240", "--batch-size", "1",
       "--max-seq-len", "1024", "--global-batch-size", "12", "--epochs", "2", "--warmup-steps", "2", "--lora-rank", "4", "--precision",
       "fp32", "--record-indices", "--progress-interval", "1000", "--device", "cpu"]


def with_values(args, values):
    """args with the value after each flag of `values` replaced."""
    return [values.get(args[i - 1], a) if i > 0 else a for i, a in enumerate(args)]


def newest_checkpoint(directory):
    return sorted(glob.glob(f"{directory}/*/step-?????????"))[-1]


def rank_tensors(step_dir, rank):
    return safetensors_torch.load_file(f"{step_dir}/rank-{rank:05d}.safetensors")


def runs_by_start(path):
    """The file's runs in the order they started (run ids start with their UTC start time)."""
    f = h5py.File(path, "r")
    return f, [f["runs"][k] for k in sorted(f["runs"])]


def computed(run, epoch):
    """Every sample index the run's ranks computed in the epoch (-1: not this run's)."""
    out = []
    for r in range(int(run.attrs["world_size"])):
        out += [int(i) for i in run[f"rank_{r}"]["indices"][epoch] if i >= 0]
    return out


def steps(run):
    """(epoch, step in the epoch) -> learning rate of rank 0's written step records."""
    s = run["rank_0"]["steps"][:]
    return {(int(e), int(k)): float(lr) for e, k, lr in zip(s["epoch"], s["step"], s["lr"]) if e >= 0}


@pytest.mark.parametrize("sharding", ["fsdp", "none"])
def test_a_run_stopped_at_2_ranks_continues_at_3_and_ends_at_2_as_if_uninterrupted(tmp_path, sharding):
    if not MODEL.exists():
        pytest.skip(f"no oracle model at {MODEL} (ctest runs the oracles fixture first)")
    llm = [*LLM, "--sharding", sharding]
    ref = mgbench(*llm, "--checkpoint-dir", tmp_path / "ref", "--results", tmp_path / "ref.h5", np=2)
    assert ref.returncode == 0, ref.stderr
    ck, results = tmp_path / "ck", tmp_path / "r.h5"
    args = [*llm, "--checkpoint-dir", ck, "--checkpoint-every", "5", "--results", results]
    preempt(args, ck, 5, np=2)
    err = preempt([*args, "--resume"], ck, 25, np=3)  # over the epoch's end, stopped inside the second
    assert "resuming a checkpoint of 2 rank(s) at 3" in err, err
    last = mgbench(*args, "--resume", np=2)
    assert last.returncode == 0, last.stderr
    assert "resuming a checkpoint of 3 rank(s) at 2" in last.stderr, last.stderr

    # The parameters of the uninterrupted run, shard by shard (fsdp) or replica by replica.
    ours, theirs = newest_checkpoint(ck), newest_checkpoint(tmp_path / "ref")
    assert ours.endswith("step-000000040") and theirs.endswith("step-000000040")
    for r in (0, 1):
        a, b = rank_tensors(ours, r), rank_tensors(theirs, r)
        names = [k for k in b if k.startswith("model/") or k.startswith("optimizer/")]
        assert names and set(names) <= set(a)
        for k in names:
            np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), rtol=1e-5, atol=1e-6, err_msg=f"rank {r}: {k}")

    f, runs = runs_by_start(results)
    with f, h5py.File(tmp_path / "ref.h5", "r") as g:
        (reference,) = g["runs"].values()
        assert [int(run.attrs["world_size"]) for run in runs] == [2, 3, 2]
        assert [run["status"][0] for run in runs] == [b"preempted", b"preempted", b"completed"]
        for before, after in zip(runs, runs[1:]):
            assert after.attrs["continues_run"] == before.name.rsplit("/", 1)[1]
            assert after.attrs["continues_world_size"] == before.attrs["world_size"]
        assert [int(run.attrs["grad_accum"]) for run in runs] == [6, 4, 6]
        # Every step once, over the three runs, at the uninterrupted run's learning rate.
        recorded = [steps(run) for run in runs]
        assert sum(len(s) for s in recorded) == 40
        merged = {k: v for s in recorded for k, v in s.items()}
        assert merged == pytest.approx(steps(reference), rel=1e-12)
        # Every sample of each epoch computed once, by one run or another.
        for epoch in (0, 1):
            assert sorted(sum((computed(run, epoch) for run in runs), [])) == sorted(computed(reference, epoch))
        # An epoch's record counts the run's own steps, not a continuation's placeholders of the earlier ones.
        for run in runs:
            e, s = run["rank_0"]["epochs"][:], run["rank_0"]["steps"][:]
            assert all(n == np.sum(s["epoch"] == k) for k, n in zip(e["epoch"], e["steps"]) if k >= 0), (e, s["epoch"])
        assert int(runs[1]["rank_0"]["epochs"][0]["steps"]) < 20
        ids = [run.name.rsplit("/", 1)[1] for run in runs]
    report = mgbench("report", results, check=True).stdout
    assert f"# {ids[1]} continues run {ids[0]} (its 2 rank(s) stopped at global step" in report, report
    assert f"# {ids[2]} continues run {ids[1]} (its 3 rank(s) stopped at global step" in report, report
    assert f"# {ids[0]} preempted: continued by run {ids[1]} at another number of ranks" in report, report
    assert f"# {ids[1]} preempted: continued by run {ids[2]}" in report and "plus --resume" not in report, report


def test_without_a_global_batch_size_another_number_of_ranks_is_refused(tmp_path):
    if not MODEL.exists():
        pytest.skip(f"no oracle model at {MODEL} (ctest runs the oracles fixture first)")
    fixed = [a for a in LLM if a not in ("--global-batch-size", "12")] + ["--grad-accum", "6", "--max-steps", "1"]
    first = mgbench(*fixed, "--checkpoint-dir", tmp_path / "ck", "--results", tmp_path / "r.h5", np=2)
    assert first.returncode == 0, first.stderr
    again = mgbench(*fixed, "--checkpoint-dir", tmp_path / "ck", "--resume", "--results", tmp_path / "r.h5", np=3)
    assert again.returncode == 1
    assert "written by 2 rank(s)" in again.stderr and "--global-batch-size" in again.stderr, again.stderr
    both = mgbench(*LLM, "--grad-accum", "2", "--results", tmp_path / "x.h5", np=2)
    assert both.returncode != 0 and "--global-batch-size 12 with --grad-accum 2" in both.stderr, both.stderr
    uneven = mgbench(*LLM, "--results", tmp_path / "x.h5", np=5)
    assert uneven.returncode != 0 and "--global-batch-size 12: not a multiple of --batch-size 1 x 5" in uneven.stderr


@pytest.mark.parametrize("stopped_at, resumed_at", [(2, 3), (3, 2)])
def test_an_epoch_of_another_number_of_steps_at_the_new_world_size_is_said(tmp_path, stopped_at, resumed_at):
    """250 samples: 125 a rank make 20 steps of 6 at 2 ranks, 84 a rank 21 steps of 4 at 3 (padding).
    2 -> 3: stopped inside the epoch; 3 -> 2: stopped at its last step (21, past the 20 it has at 2
    ranks: the epoch's end is all that is left)."""
    if not MODEL.exists():
        pytest.skip(f"no oracle model at {MODEL} (ctest runs the oracles fixture first)")
    args = [*with_values(LLM, {"--limit": "250", "--epochs": "1"}), "--checkpoint-dir", tmp_path / "ck",
            "--checkpoint-every", "5" if stopped_at == 2 else "1", "--results", tmp_path / "r.h5"]
    preempt(args, tmp_path / "ck", 5 if stopped_at == 2 else 19, np=stopped_at)
    proc = mgbench(*args, "--resume", np=resumed_at)
    assert proc.returncode == 0, proc.stderr
    steps = {2: 20, 3: 21}
    assert (f"an epoch has {steps[resumed_at]} optimizer steps here and {steps[stopped_at]} there (the ranks' padding "
            f"of 250 samples), so the schedule runs over {steps[resumed_at]} steps instead of {steps[stopped_at]}"
            ) in proc.stderr, proc.stderr
    if stopped_at == 3:
        assert "epoch 1 at its end (its steps were all taken)" in proc.stderr, proc.stderr


def test_a_checkpoint_at_an_epochs_last_step_resumes_at_another_number_of_ranks(tmp_path, mnist):
    """A stop at the epoch's last step checkpoints before the epoch's end (records, evaluation) ran: its
    position is the whole plan, not 0. ddp-rr continues it at 3 ranks (refused before: "inside epoch 1"),
    ending epoch 1 there with nothing left to load, and trains epoch 2 at 3 ranks."""
    image = ["image", *SMALL, "--data", mnist, "--limit-train", "2048", "--limit-test", "64", "--epochs", "2",
             "--batch-size", "16", "--global-batch-size", "96", "--strategy", "ddp-rr",
             "--checkpoint-dir", tmp_path / "ck", "--checkpoint-every", "1", "--record-indices",
             "--results", tmp_path / "r.h5"]
    # 21 steps an epoch at 2 ranks: the stop after checkpoint 19 comes at step 21 (the stop agreement is
    # read a step after it was started).
    preempt(image, tmp_path / "ck", 19, np=2)
    assert newest_checkpoint(tmp_path / "ck").endswith("step-000000021")
    proc = mgbench(*image, "--resume", np=3)
    assert proc.returncode == 0, proc.stderr
    assert "epoch 1 at its end (its steps were all taken)" in proc.stderr, proc.stderr
    f, (stopped, continued) = runs_by_start(tmp_path / "r.h5")
    with f:
        assert len(computed(stopped, 0)) == 21 * 6 * 16 and computed(stopped, 1) == []
        # The continuation took no step of epoch 1 and wrote its end: the epoch's record and evaluation.
        assert computed(continued, 0) == [] and len(computed(continued, 1)) == 21 * 6 * 16
        epochs = continued["rank_0"]["epochs"][:]
        assert list(epochs["epoch"]) == [0, 1] and list(epochs["steps"]) == [0, 21], epochs
        assert list(epochs["test_samples"]) == [64, 64], epochs
        assert int(continued["summary"]["epochs_completed"][0]) == 2


def test_inside_an_epoch_only_distributed_sampler_order_resumes_at_another_number_of_ranks(tmp_path, mnist):
    """ddp-rr cuts each batch by the world size: its epoch's rest at 3 ranks is not the same samples."""
    # 2 epochs of 21 steps at 2 ranks (round robin: 128 batches, 64 computed a rank, 3 a step): stopped inside the first.
    image = ["image", *SMALL, "--data", mnist, "--limit-train", "2048", "--limit-test", "64", "--epochs", "2",
             "--batch-size", "16", "--global-batch-size", "96", "--strategy", "ddp-rr", "--checkpoint-dir", tmp_path / "ck",
             "--checkpoint-every", "1", "--results", tmp_path / "r.h5"]
    preempt(image, tmp_path / "ck", 1, np=2)
    proc = mgbench(*image, "--resume", np=3)
    assert proc.returncode == 1, proc.stderr
    assert "stopped inside epoch 1, and with --strategy ddp-rr the rest of that epoch at 3 rank(s)" in proc.stderr
    assert "resume it with 2 rank(s)" in proc.stderr, proc.stderr
    # Refused before the run is recorded: the file holds the stopped run only.
    with h5py.File(tmp_path / "r.h5", "r") as f:
        assert len(f["runs"]) == 1
    assert mgbench(*image, "--resume", np=2).returncode == 0
