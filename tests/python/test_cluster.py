"""Several nodes, simulated (issue 30): network namespaces as nodes (tests/cluster/cluster.sh: own
host names and addresses, Open MPI over TCP through an rsh agent, one shared file system). Jobs across
2 nodes x 1 rank give results bitwise equal to 2 ranks on one node (CPU, fp32: the same per-step
losses on every rank), and each rank knows its node: host name, local rank, the node's thread share.

Skipped, with the reason, where the namespaces cannot be made (not root)."""
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import BIN, ENV, MPIEXEC, SHARED, SMALL

h5py = pytest.importorskip("h5py")
np = pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "tests" / "cluster" / "cluster.sh"
MNIST = SHARED / "mnist"
MODEL = Path(os.environ.get("MGBENCH_ORACLE_DIR", "")) / "llama_tiny_2256"
TOKENIZER = SHARED / "llama3" / "tiktoken_small.model"
ALPACA = SHARED / "text" / "alpaca" / "alpaca_cleaned_first5k.json"


@pytest.fixture(scope="module")
def cluster():
    if not (MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"no MNIST at {MNIST}")
    d = Path(tempfile.mkdtemp(prefix="mgbench-cluster-"))
    started = subprocess.run([str(CLUSTER), "start", str(d), "2"], capture_output=True, text=True)
    try:
        if started.returncode == 77:
            pytest.skip(started.stderr.strip().splitlines()[-1])
        assert started.returncode == 0, started.stdout + started.stderr
        yield d
    finally:
        subprocess.run([str(CLUSTER), "stop", str(d)])
        shutil.rmtree(d, ignore_errors=True)


def on_two_nodes(cluster, *args):
    """mgbench ARGS on node1 and node2, one rank each, over the simulated network."""
    cmd = [str(cluster / "mpirun"), "-np", "2", "--hostfile", str(cluster / "hostfile"), "--bind-to", "none", BIN,
           *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def on_one_node(*args):
    cmd = [MPIEXEC, "-np", "2", "--oversubscribe", "--bind-to", "none", BIN, *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def last_run(path):
    f = h5py.File(path, "r")
    return f, list(f["runs"].values())[-1]


def assert_same_steps(a_path, b_path):
    fa, a = last_run(a_path)
    fb, b = last_run(b_path)
    with fa, fb:
        for r in range(2):
            la, lb = a[f"rank_{r}/steps"]["loss"], b[f"rank_{r}/steps"]["loss"]
            written = a[f"rank_{r}/steps"]["epoch"] >= 0
            assert written.sum() > 0 and np.array_equal(la[written], lb[written]), f"rank {r}: losses differ"
        assert a["summary"][0]["final_loss"] == b["summary"][0]["final_loss"]


def assert_ranks_on_their_nodes(path, threads):
    f, run = last_run(path)
    with f:
        assert run.attrs["hosts"] == "node1,node2" and run.attrs["nodes"] == 2
        for r in range(2):
            attrs = run[f"rank_{r}"].attrs
            assert attrs["hostname"] == f"node{r + 1}" and attrs["local_rank"] == 0, dict(attrs)
            assert attrs["threads"] == threads, (r, dict(attrs))


def test_image_across_two_nodes_equals_one_node(cluster, tmp_path):
    args = ["image", "--data", MNIST, *SMALL, "--limit-train", "256", "--limit-test", "64", "--epochs", "2",
            "--batch-size", "32"]
    on_two_nodes(cluster, *args, "--results", tmp_path / "nodes.h5")
    on_one_node(*args, "--results", tmp_path / "node.h5")
    assert_same_steps(tmp_path / "nodes.h5", tmp_path / "node.h5")
    assert_ranks_on_their_nodes(tmp_path / "nodes.h5", threads=1)


def test_each_rank_takes_its_nodes_share_of_the_cores(cluster, tmp_path):
    """--threads 0: the cores a rank may run on, at most its node's cores / the ranks on the node --
    all of them for the only rank of a node, half for each of two ranks on one node."""
    args = ["image", "--data", MNIST, "--image-size", "32", "--width-mult", "0.25", "--device", "cpu",
            "--threads", "0", "--limit-train", "128", "--limit-test", "32", "--epochs", "1", "--batch-size", "32",
            "--progress-interval", "1000"]
    cores = os.cpu_count()
    on_two_nodes(cluster, *args, "--results", tmp_path / "nodes.h5")
    assert_ranks_on_their_nodes(tmp_path / "nodes.h5", threads=cores)
    on_one_node(*args, "--results", tmp_path / "node.h5")
    f, run = last_run(tmp_path / "node.h5")
    with f:
        assert [run[f"rank_{r}"].attrs["threads"] for r in range(2)] == [max(1, cores // 2)] * 2


@pytest.mark.parametrize("sharding", ["none", "fsdp"])
def test_lora_across_two_nodes_equals_one_node(cluster, tmp_path, sharding):
    if not MODEL.exists():
        pytest.skip(f"no tiny Llama oracle at {MODEL}")
    args = ["llm", "--model", MODEL, "--tokenizer", TOKENIZER, "--dataset", "alpaca", "--data", ALPACA, "--limit",
            "32", "--batch-size", "2", "--max-steps", "4", "--lora-rank", "4", "--precision", "fp32", "--threads", "1",
            "--progress-interval", "1000", "--device", "cpu", "--sharding", sharding]
    on_two_nodes(cluster, *args, "--results", tmp_path / "nodes.h5")
    on_one_node(*args, "--results", tmp_path / "node.h5")
    assert_same_steps(tmp_path / "nodes.h5", tmp_path / "node.h5")
    assert_ranks_on_their_nodes(tmp_path / "nodes.h5", threads=1)


def test_comm_across_two_nodes_checks_every_result(cluster, tmp_path):
    proc = on_two_nodes(cluster, "comm", "--collective", "all", "--min-bytes", "1024", "--max-bytes", "64K",
                        "--results", tmp_path / "comm.h5")
    assert "# Out of bounds values : 0 OK" in proc.stdout, proc.stdout[-3000:]
    f, run = last_run(tmp_path / "comm.h5")
    with f:
        assert run.attrs["hosts"] == "node1,node2"
        for r in range(2):
            rows = run[f"rank_{r}/comm"][:]
            written = rows[rows["bytes"] >= 0]
            assert len(written) > 0 and (written["wrong"] == 0).all()
