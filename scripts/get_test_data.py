#!/usr/bin/env python3
"""Finds or builds the test suite's inputs and prints their directory as the last line of stdout.

The inputs are real public data nobody on the project wrote (MNIST, the Llama 3 tokenizer, alpaca,
preference pairs, a tiny pretrained Llama), in the layout of the team's ../shared/data, whose
README.md gives each file's provenance. They stay out of the repository (several licences are
non-commercial); a machine without the team's copy fetches each file from its public upstream:

  1. MGBENCH_SHARED_DATA, when set: it must hold every input (else exit 1 naming the missing ones);
  2. ../shared/data beside the checkout (MGBENCH_TEAM_DATA), when it holds every input: read in place;
  3. the cache, $MGBENCH_DATA_CACHE/test-inputs (default ~/.cache/mgbench/data), when every file in it
     passes its sha256;
  4. else the cache is built: each file downloaded from a pinned commit or release (the download's
     sha256 checked), cut or converted as the shared copy was (the first 10,000 MNIST training images,
     SAMSum's Arrow files as JSON, ...), the result's sha256 checked against the shared copy's.
     MNIST comes through scripts/get-mnist.sh (torchvision's mirrors and md5s).
  MGBENCH_TEST_DATA_MIRROR=DIR reads https://HOST/PATH from DIR/HOST/PATH instead of the network.

Usage:  scripts/get-test-data.sh            (the venv's Python, pyarrow from TorchTune's folder)
        scripts/get_test_data.py --list     (each input: path, upstream, licence)
Exit 1 naming each file that could not be had, where it was looked for, and the way out.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

CHECKOUT = Path(__file__).resolve().parents[1]
GITHUB = "https://raw.githubusercontent.com/"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- the conversions from an upstream file to the shared copy (each tested: tests/python/test_test_data.py)


def identity(data: bytes) -> bytes:
    return data


def wheel_member(member: str) -> Callable[[bytes], bytes]:
    """A file inside a wheel (a zip archive)."""

    def convert(data: bytes) -> bytes:
        with zipfile.ZipFile(io.BytesIO(data)) as wheel:
            return wheel.read(member)

    return convert


def gzip_as_python(data: bytes, name: str) -> bytes:
    """gzip as the shared copy was written: Python's gzip, level 9, mtime 0, the original name."""
    out = io.BytesIO()
    with gzip.GzipFile(filename=name, mode="wb", fileobj=out, compresslevel=9, mtime=0) as f:
        f.write(data)
    return out.getvalue()


def idx_first(count: int, name: str) -> Callable[[bytes], bytes]:
    """The first `count` items of a gzipped IDX file (MNIST's format: magic, counts, then uint8 items),
    its item count rewritten, gzipped as gzip_as_python."""

    def convert(data: bytes) -> bytes:
        raw = gzip.decompress(data)
        magic = struct.unpack(">I", raw[:4])[0]
        dims = magic & 0xFF
        shape = struct.unpack(f">{dims}I", raw[4 : 4 + 4 * dims])
        if magic >> 8 != 0x08 or shape[0] < count:
            raise ValueError(f"not an IDX file of uint8 with at least {count} items: magic {magic:#x}, shape {shape}")
        item = 1
        for d in shape[1:]:
            item *= d
        header = struct.pack(f">{dims + 1}I", magic, count, *shape[1:])
        body = raw[4 + 4 * dims : 4 + 4 * dims + count * item]
        return gzip_as_python(header + body, name)

    return convert


def orca_from_dpo_en_demo(data: bytes) -> bytes:
    """The SlimOrca-shaped stand-in: LLaMA-Factory's dpo_en_demo rows that open with a system turn,
    in file order, each as its conversation followed by the chosen answer, with the row's index."""
    rows = json.loads(data)
    out = [
        {"src_index": i, "conversations": row["conversations"] + [row["chosen"]]}
        for i, row in enumerate(rows)
        if row["conversations"][0]["from"] == "system"
    ]
    return json.dumps(out, indent=1, ensure_ascii=False).encode("utf-8")


def samsum_from_arrow(data: bytes) -> bytes:
    """A Hugging Face `save_to_disk` split (an Arrow IPC stream) as a JSON list of {id, dialogue, summary}."""
    try:
        import pyarrow as pa
    except ImportError as e:
        raise RuntimeError("pyarrow is needed to convert SAMSum's Arrow files (scripts/install-deps.sh "
                           "installs it into the venv's torchtune-site; scripts/get-test-data.sh adds that)") from e
    table = pa.ipc.open_stream(pa.BufferReader(data)).read_all()
    rows = [{"id": r["id"], "dialogue": r["dialogue"], "summary": r["summary"]} for r in table.to_pylist()]
    return json.dumps(rows, indent=1, ensure_ascii=False).encode("utf-8")


@dataclass(frozen=True)
class Input:
    """One input of the suite: `path` under the data directory; `sha256` of its bytes (with
    `gunzipped`: of its decompressed bytes, where the deflate stream depends on zlib's version);
    where it comes from: `url` (with `url_sha256` of the download) or `mnist` (an official file
    that scripts/get-mnist.sh fetches); `convert` from the download to the file; `licence`."""

    path: str
    sha256: str
    licence: str
    url: str = ""
    url_sha256: str = ""
    mnist: str = ""
    convert: Callable[[bytes], bytes] = identity
    gunzipped: bool = False

    def check(self, data: bytes) -> str:
        """"" when data is this input's, else why not."""
        got = sha256(gzip.decompress(data) if self.gunzipped else data)
        return "" if got == self.sha256 else f"sha256{' (decompressed)' if self.gunzipped else ''} {got}, expected {self.sha256}"

    def upstream(self) -> str:
        return self.url or f"MNIST's official {self.mnist} (scripts/get-mnist.sh: torchvision's mirrors and md5s)"


def _github(repo: str, commit: str, path: str) -> str:
    return f"{GITHUB}{repo}/{commit}/{path}"


_LLAMA_MODELS_WHEEL = ("https://files.pythonhosted.org/packages/3e/da/36302a2846e4123dc43cd913228ea3a5efd2a56e2f8942f4"
                       "cf54114745ed/llama_models-0.3.0-py3-none-any.whl")
_DPO_EN_DEMO = _github("hiyouga/LLaMA-Factory", "a0d44c650a9a38c1ec6c8fc48a7daeacca9900a9", "data/dpo_en_demo.json")
_SAMSUM = "karim-nadim/Text-Summarizer-Project", "e58dae11071a1f463a5b3f8499601cd22011d589"
_STORIES = "clebert/llama2.zig", "8b4a530540d3323b77148535738129803ce86b48"

INPUTS: tuple[Input, ...] = (
    Input("mnist/train-images-idx3-ubyte.gz", "2889698e6bc3614913e76901316712919d1998fc2b44512451bfe65bc1e668b1",
          "CC BY-SA 3.0 (Y. LeCun, C. Cortes)", mnist="train-images-idx3-ubyte.gz",
          convert=idx_first(10000, "train-images-idx3-ubyte"), gunzipped=True),
    Input("mnist/train-labels-idx1-ubyte.gz", "651e38e2ac0632f5113ec18f1df4977117f953197819034009971a6675a0df78",
          "CC BY-SA 3.0 (Y. LeCun, C. Cortes)", mnist="train-labels-idx1-ubyte.gz",
          convert=idx_first(10000, "train-labels-idx1-ubyte"), gunzipped=True),
    Input("mnist/t10k-images-idx3-ubyte.gz", "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
          "CC BY-SA 3.0 (Y. LeCun, C. Cortes)", mnist="t10k-images-idx3-ubyte.gz"),
    Input("mnist/t10k-labels-idx1-ubyte.gz", "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
          "CC BY-SA 3.0 (Y. LeCun, C. Cortes)", mnist="t10k-labels-idx1-ubyte.gz"),
    Input("llama3/tokenizer.model", "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
          "Llama 3 Community License (Meta's llama-models 0.3.0 on PyPI)", url=_LLAMA_MODELS_WHEEL,
          url_sha256="7f77f78ff13fca09f70d76a376aff6414cd901623fb9d57e69c2f8367a73032f",
          convert=wheel_member("llama_models/llama3/tokenizer.model")),
    Input("llama3/tiktoken_small.model", "fe3dbabb7ef48a908910462610281173e08f2bc6f49bc2cc8ed89712a5e77bc8",
          "BSD-3-Clause (TorchTune's test asset)",
          url=_github("pytorch/torchtune", "20747cd87ba803d514d5d3d57e90fcfb059ecf56",
                      "tests/assets/tiktoken_small.model")),
    Input("models/stories260K/stories260K.bin", "b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696",
          "MIT (A. Karpathy's tinyllamas)", url=_github(*_STORIES, "models/tinystories_260k/checkpoint_legacy.bin")),
    Input("text/alpaca/alpaca_cleaned_first5k.json", "5f9b70e54ff1d5a87cd3ca9074502fdb5d5312eaf76f736431f636be2183662c",
          "CC BY-NC 4.0 (Stanford Alpaca's data; alpaca-cleaned)",
          url=_github("makhweeb/text-ngnr", "baa57f02b969b99d78f42fb28efddb7e1315c56c", "5k.json")),
    Input("text/grammar/c4_200m_first1k.csv", "6538a1508bb6382b4e8dfc4c1a14ba985c743524e5b3164b9be0bbb2a18e21c7",
          "CC BY 4.0 / ODC-BY (C4_200M)",
          url=_github("lessw2020/t5_11", "aa017829a1eb3701536c86dbfd5e492c7e5fd6c8",
                      "datasets_grammar/c4_dataset/c4train_1k.csv")),
    Input("text/dpo/stack_exchange_paired_tiny_torchtune.json",
          "bd78b95515363c6d92e405cd44f574710269e2351007d635daf134269093d5a1", "CC BY-SA 4.0 (TorchTune's test asset)",
          url=_github("pytorch/torchtune", "dcb95318237d3b6ecebe274e984d66a4432cf7c9",
                      "tests/assets/stack_exchange_paired_tiny.json")),
    Input("text/dpo/dpo_en_demo_llamafactory.json", "b949be2421cfa62744afcf1b479f95b299d643d1a4c1c97d1341b314a1aa5cb3",
          "Apache-2.0 (LLaMA-Factory)", url=_DPO_EN_DEMO),
    Input("text/dpo/hh_rlhf_harmless_base_test.jsonl.gz",
          "ebfaaed21162a4de120ae85366075b34425e2a6303fac59b99555002f7016f03", "MIT (Anthropic's hh-rlhf)",
          url=_github("anthropics/hh-rlhf", "0398e3636f8d641a03d65b9362aa091297f28564", "harmless-base/test.jsonl.gz")),
    Input("text/slimorca/orca_style_80_from_dpo_en_demo.json",
          "70683fbd6e62325d02554cf00cb2c85c513fe7f850e2966350748f43720a7a9a", "Apache-2.0 (LLaMA-Factory)",
          url=_DPO_EN_DEMO, url_sha256="b949be2421cfa62744afcf1b479f95b299d643d1a4c1c97d1341b314a1aa5cb3",
          convert=orca_from_dpo_en_demo),
    Input("text/samsum/samsum_validation_818.json", "bc4958b17ba4ad1c9550cdfca0088caedcf11b8cd0b9df12d9b8f7721a5014dc",
          "CC BY-NC-ND 4.0 (SAMSum)",
          url=_github(*_SAMSUM, "artifacts/data_ingestion/samsum_dataset/validation/data-00000-of-00001.arrow"),
          url_sha256="d4d6a062b9c4eb48e70f879d0da2f347ab2096c5763890902e14bc2c51cd6341", convert=samsum_from_arrow),
    Input("text/samsum/samsum_test_819.json", "91d71f0c9c6e0a6b6374e01cb6158e1704cb506496c00d72a5a56b6dc439cada",
          "CC BY-NC-ND 4.0 (SAMSum)",
          url=_github(*_SAMSUM, "artifacts/data_ingestion/samsum_dataset/test/data-00000-of-00001.arrow"),
          url_sha256="202d60cb33640c7589d74cab0f8ed4a4a9900c3c41e4cc8f339e0c2a89afc7f7", convert=samsum_from_arrow),
)


def missing_in(directory: Path) -> list[str]:
    return [i.path for i in INPUTS if not (directory / i.path).is_file()]


def download(url: str) -> bytes:
    mirror = os.environ.get("MGBENCH_TEST_DATA_MIRROR")
    if mirror:
        local = Path(mirror) / url.split("://", 1)[1]
        if not local.is_file():
            raise OSError(f"not in the mirror: {local}")
        return local.read_bytes()
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def official_mnist() -> Path:
    """The directory of MNIST's four official files: scripts/get-mnist.sh --official (its cache, or a
    download checked against torchvision's md5s; with MGBENCH_TEST_DATA_MIRROR, from the mirror)."""
    env = dict(os.environ)
    mirror = os.environ.get("MGBENCH_TEST_DATA_MIRROR")
    if mirror:
        env["MGBENCH_MNIST_MIRRORS"] = f"file://{Path(mirror).resolve()}/ossci-datasets.s3.amazonaws.com/mnist/"
    run = subprocess.run([str(CHECKOUT / "scripts" / "get-mnist.sh"), "--official"], env=env, capture_output=True,
                         text=True, check=False)
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines:
        raise OSError(f"scripts/get-mnist.sh --official exited {run.returncode}: {run.stderr.strip()}")
    return Path(lines[-1])


class Sources:
    """Each upstream fetched once, its failure too: a URL's bytes (checked against its sha256), or the
    directory of MNIST's official files."""

    def __init__(self):
        self._got: dict[str, bytes | Path | OSError] = {}

    def _once(self, key: str, get):
        if key not in self._got:
            try:
                self._got[key] = get()
            except OSError as e:
                self._got[key] = e
        if isinstance(self._got[key], OSError):
            raise self._got[key]
        return self._got[key]

    def upstream_of(self, i: Input) -> bytes:
        if i.mnist:
            return (self._once("mnist", official_mnist) / i.mnist).read_bytes()
        data = self._once(i.url, lambda: download(i.url))
        expected = i.url_sha256 or i.sha256
        if sha256(data) != expected:
            raise ValueError(f"the download's sha256 is {sha256(data)}, expected {expected}")
        return data


def build(cache: Path) -> tuple[int, list[str]]:
    """Fetches into `cache` every input not already there and passing its sha256; returns how many it
    wrote and the failures."""
    written, failures = 0, []
    sources = Sources()
    for i in INPUTS:
        target = cache / i.path
        if target.is_file() and not i.check(target.read_bytes()):
            continue
        try:
            result = i.convert(sources.upstream_of(i))
            why = i.check(result)
            if why:
                raise ValueError(f"converted from the download: {why}")
        except (OSError, ValueError, RuntimeError, KeyError, struct.error, zipfile.BadZipFile) as e:
            failures.append(f"{i.path} from {i.upstream()}: {e}")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
            tmp.write(result)
        os.replace(tmp.name, target)
        written += 1
        print(f"get-test-data: {target} ({i.licence})", file=sys.stderr)
    return written, failures


def resolve() -> Path:
    explicit = os.environ.get("MGBENCH_SHARED_DATA")
    if explicit:
        missing = missing_in(Path(explicit))
        if missing:
            raise SystemExit(f"get-test-data: MGBENCH_SHARED_DATA={explicit} lacks {', '.join(missing)}: "
                             "unset it to use ../shared/data or the cache, or complete it")
        return Path(explicit)
    team = Path(os.environ.get("MGBENCH_TEAM_DATA", CHECKOUT.parent / "shared" / "data"))
    if not missing_in(team):
        print(f"get-test-data: using the team's copy {team}", file=sys.stderr)
        return team
    cache = Path(os.environ.get("MGBENCH_DATA_CACHE", Path.home() / ".cache" / "mgbench" / "data")) / "test-inputs"
    print(f"get-test-data: no complete copy at {team}: the cache {cache}, fetching what it lacks", file=sys.stderr)
    written, failures = build(cache)
    if failures:
        raise SystemExit("get-test-data: could not get " + str(len(failures)) + " input(s):\n  " +
                         "\n  ".join(failures) + "\nWith a network to github.com, files.pythonhosted.org and "
                         "torchvision's MNIST mirrors, run scripts/get-test-data.sh again; or point "
                         "MGBENCH_SHARED_DATA at a copy of the team's ../shared/data.")
    print(f"get-test-data: using {cache} ({written} file(s) fetched, the others' checksums verified)", file=sys.stderr)
    return cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print each input: path, upstream, licence")
    if parser.parse_args().list:
        for i in INPUTS:
            print(f"{i.path}\t{i.upstream()}\t{i.licence}")
        return
    print(resolve())


if __name__ == "__main__":
    main()
