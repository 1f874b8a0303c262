"""scripts/get-test-data.sh: where the suite's inputs come from on a machine without the team's
../shared/data -- each file from its public upstream, checked by sha256, converted as the shared copy
was. The upstreams are out of this machine's reach; what is tested is every step after the download:
the conversions rebuild the shared copies byte for byte from upstream-shaped files, a mirror's files
are checked and written, a wrong or missing one is named, a verified cache is reused."""
import gzip
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import SHARED

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "get-test-data.sh"
sys.path.insert(0, str(ROOT / "scripts"))
import get_test_data as g  # noqa: E402

BY_PATH = {i.path: i for i in g.INPUTS}


@pytest.fixture(scope="module", autouse=True)
def shared():
    missing = [p for p in BY_PATH if not (SHARED / p).is_file()]
    if missing:
        pytest.skip(f"the shared copies to compare with are missing under {SHARED}: {missing}")


def read(path):
    return (SHARED / path).read_bytes()


def run(env, *args):
    full = {k: v for k, v in os.environ.items() if k != "MGBENCH_SHARED_DATA"}
    full.update(env)
    return subprocess.run([str(SCRIPT), *args], env=full, capture_output=True, text=True, timeout=300)


def test_every_input_of_the_suite_is_listed_with_its_sha256():
    # The manifest is the shared copy: every file the suite reads, each with the sha256 it has there.
    for i in g.INPUTS:
        assert i.check(read(i.path)) == "", i.path
        assert i.licence and (i.url or i.mnist), i.path
    listed = set(BY_PATH)
    for needed in ("llama3/tokenizer.model", "llama3/tiktoken_small.model", "mnist/train-images-idx3-ubyte.gz",
                   "text/dpo/hh_rlhf_harmless_base_test.jsonl.gz", "models/stories260K/stories260K.bin"):
        assert needed in listed


def test_the_conversions_rebuild_the_shared_copies_byte_for_byte():
    # LLaMA-Factory's dpo_en_demo.json is the upstream itself (the same sha256): the real conversion.
    orca = BY_PATH["text/slimorca/orca_style_80_from_dpo_en_demo.json"]
    assert g.sha256(read("text/dpo/dpo_en_demo_llamafactory.json")) == orca.url_sha256
    assert orca.check(orca.convert(read("text/dpo/dpo_en_demo_llamafactory.json"))) == ""

    # The tokenizer from a wheel holding it where Meta's llama-models 0.3.0 does.
    wheel = io.BytesIO()
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llama_models/llama4/tokenizer.model", b"not this one")
        z.writestr("llama_models/llama3/tokenizer.model", read("llama3/tokenizer.model"))
    tokenizer = BY_PATH["llama3/tokenizer.model"]
    assert tokenizer.check(tokenizer.convert(wheel.getvalue())) == ""

    # MNIST's training files cut from an official-shaped file of more items (the count rewritten).
    for path, item in (("mnist/train-images-idx3-ubyte.gz", 784), ("mnist/train-labels-idx1-ubyte.gz", 1)):
        raw = gzip.decompress(read(path))
        dims = raw[3]
        shape = struct.unpack(f">{dims}I", raw[4:4 + 4 * dims])
        assert shape[0] == 10000
        longer = raw[:4] + struct.pack(">I", 60000) + raw[8:] + bytes(range(256)) * (50000 * item // 256 + 1)
        cut = BY_PATH[path].convert(gzip.compress(longer))
        assert BY_PATH[path].check(cut) == "", path
        assert gzip.decompress(cut) == raw

    # SAMSum from a Hugging Face save_to_disk stream of its columns (the upstream's order: id, summary, dialogue).
    sys.path.insert(0, str(Path(sys.prefix) / "torchtune-site"))
    pa = pytest.importorskip("pyarrow")
    for path in ("text/samsum/samsum_test_819.json", "text/samsum/samsum_validation_818.json"):
        rows = json.loads(read(path))
        table = pa.table({k: [r[k] for r in rows] for k in ("id", "summary", "dialogue")})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        assert BY_PATH[path].check(BY_PATH[path].convert(sink.getvalue().to_pybytes())) == "", path


def test_a_wrong_conversion_is_refused():
    orca = BY_PATH["text/slimorca/orca_style_80_from_dpo_en_demo.json"]
    rows = json.loads(read("text/dpo/dpo_en_demo_llamafactory.json"))
    rows[1]["chosen"]["value"] += " "
    assert orca.check(orca.convert(json.dumps(rows).encode())).startswith("sha256 ")
    with pytest.raises(ValueError, match="at least 10000 items"):
        BY_PATH["mnist/train-labels-idx1-ubyte.gz"].convert(gzip.compress(struct.pack(">II", 2049, 3) + b"\0\1\2"))


def test_the_team_copy_is_read_in_place_and_an_incomplete_one_named(tmp_path):
    proc = run({"MGBENCH_TEAM_DATA": str(SHARED)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str(SHARED)

    partial = tmp_path / "partial"
    shutil.copytree(SHARED / "llama3", partial / "llama3")
    proc = run({"MGBENCH_SHARED_DATA": str(partial)})
    assert proc.returncode == 1
    assert f"MGBENCH_SHARED_DATA={partial} lacks mnist/train-images-idx3-ubyte.gz" in proc.stderr


def mirror_of_the_plain_downloads(mirror):
    """A mirror (MGBENCH_TEST_DATA_MIRROR's layout) of the inputs that are their upstream file as is."""
    plain = [i for i in g.INPUTS if i.url and not i.url_sha256]
    for i in plain:
        dst = mirror / i.url.split("://", 1)[1]
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SHARED / i.path, dst)
    return plain


def test_a_mirror_fills_the_cache_and_every_file_is_checked(tmp_path):
    mirror, cache = tmp_path / "mirror", tmp_path / "cache"
    plain = mirror_of_the_plain_downloads(mirror)
    hh = BY_PATH["text/dpo/hh_rlhf_harmless_base_test.jsonl.gz"]
    corrupt = mirror / hh.url.split("://", 1)[1]
    data = bytearray(corrupt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    env = {"MGBENCH_TEAM_DATA": str(tmp_path / "none"), "MGBENCH_DATA_CACHE": str(cache),
           "MGBENCH_TEST_DATA_MIRROR": str(mirror)}
    proc = run(env)
    assert proc.returncode == 1
    for i in plain:
        if i is hh:
            assert f"{i.path} from {i.url}: the download's sha256 is" in proc.stderr
            assert not (cache / "test-inputs" / i.path).exists()
        else:
            assert (cache / "test-inputs" / i.path).read_bytes() == read(i.path), i.path
    # What the mirror lacks is named with its upstream: MNIST's files, the wheel, SAMSum's Arrow files.
    assert "mnist/train-images-idx3-ubyte.gz from MNIST's official train-images-idx3-ubyte.gz" in proc.stderr
    assert f"llama3/tokenizer.model from {BY_PATH['llama3/tokenizer.model'].url}: not in the mirror" in proc.stderr
    assert "could not get 8 input(s)" in proc.stderr  # 4 MNIST, the tokenizer, 2 SAMSum, the corrupt one
    # The SlimOrca-shaped rows converted from the mirror's dpo_en_demo.json.
    orca = "text/slimorca/orca_style_80_from_dpo_en_demo.json"
    assert (cache / "test-inputs" / orca).read_bytes() == read(orca)

    # A complete cache is used as it is; a file altered in it is fetched again.
    for i in g.INPUTS:
        (cache / "test-inputs" / i.path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SHARED / i.path, cache / "test-inputs" / i.path)
    proc = run(env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str(cache / "test-inputs")
    assert "(0 file(s) fetched, the others' checksums verified)" in proc.stderr
    shutil.copy(SHARED / hh.path, corrupt)
    csv = cache / "test-inputs" / "text/grammar/c4_200m_first1k.csv"
    csv.write_bytes(b"input,target\n")
    proc = run(env)
    assert proc.returncode == 0, proc.stderr
    assert csv.read_bytes() == read("text/grammar/c4_200m_first1k.csv")
    assert "(1 file(s) fetched" in proc.stderr


def test_the_cluster_makefile_passes_the_input_directory_to_cmake():
    # Makefile.hpc's route (module systems, no scripts/test.sh): TEST_DATA becomes CMake's MGBENCH_SHARED_DATA.
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make (scripts/install-deps.sh)")

    def configure(*args):
        proc = subprocess.run([make, "-s", "-n", "-f", "Makefile.hpc", "configure", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert "-DMGBENCH_SHARED_DATA=/data/mgbench-inputs " in configure("TEST_DATA=/data/mgbench-inputs")
    assert "MGBENCH_SHARED_DATA" not in configure()
