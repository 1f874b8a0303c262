"""`mgbench tokenize` agrees with tiktoken (PyPI) on Llama 3's tokenizer, on varied text."""
import base64
import os
import subprocess

import pytest

from conftest import BIN

SHARED = os.environ.get("MGBENCH_SHARED_DATA", os.path.join(os.path.dirname(__file__), "../../../shared/data"))
LLAMA3 = os.path.join(SHARED, "llama3", "tokenizer.model")
SMALL = os.path.join(SHARED, "llama3", "tiktoken_small.model")
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "Hello world!",
    "",
    " ",
    "   leading and trailing spaces   ",
    "Tabs\tand\t\tmore\ttabs\n\n\nnewlines\r\nCRLF\r\n\r\nand \r alone",
    "Contractions: I'm, you're, he's, we've, they'll, I'd, DON'T, Won'T, SHE'S, it'S",
    "Digits 1 12 123 1234 12345 3.14159 1,000,000 2026-11-21 0x7fff",
    "Ünïcödé: naïve café, Straße, ÅNGSTRÖM, İstanbul, ǅemal",
    "Ελληνικά: Καλημέρα κόσμε. Русский: Привет, мир! Українська: ґанок",
    "中文：你好，世界。日本語：こんにちは、世界！한국어: 안녕하세요 세계",
    "العربية: مرحبا بالعالم. עברית: שלום עולם. हिन्दी: नमस्ते दुनिया। ไทย: สวัสดีชาวโลก",
    "Emoji 😀😃😄 👩‍👩‍👧‍👦 🇵🇱🇩🇪 ❤️‍🔥 and skin tones 👍🏽👍🏿",
    "Code: def f(x):\n    return x**2  # square\n\tif (a && b) { c[i] = d->e; }",
    "Punctuation!!! ??? ... --- ___ *** @@@ ### $$$ %%% ^^^ &&& (((( )))) [[ ]] {{ }} <<< >>>",
    "Mixed   whitespace \u00a0 non-breaking\u2003em space\u3000ideographic \u2028line sep\u2029para",
    "Special token text is ordinary text: <|begin_of_text|> <|eot_id|> <|start_header_id|>",
    "URLs https://example.com/path?query=1&x=y#frag and emails someone@example.org",
    "Long run of spaces:" + " " * 300 + "end",
    "Newlines only\n\n\n\n\n\n",
    "a" * 1000,
    "The quick brown fox jumps over the lazy dog. " * 20,
    "Zero-width\u200bjoiner\u200dand\ufeffBOM",
    "Combining: e\u0301 a\u0308 n\u0303, and math: ∑∫√∞≠≤≥ ½ ¾ ², ① ② ③",
    "'s 's 'S 'll 'LL 're 're' 'd''d ''",
]
# Long pieces (one regex match each): mgbench merges them with a heap, not tiktoken's linear scan,
# and must give the same ids (issue 16: a 1 MB piece took minutes).
_rng = __import__("random").Random(16)
CORPUS += [
    "".join(_rng.choice("ACGT") for _ in range(20000)),                       # DNA
    "".join(_rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6000)),  # letters
    base64.b64encode(bytes(_rng.randrange(256) for _ in range(6000))).decode(),  # a base64 blob
    "ab" * 3000 + "ba" * 3000,
    "ж" * 2000 + "z" * 129,
]


def tiktoken_encoding(path, name):
    tiktoken = pytest.importorskip("tiktoken")
    from tiktoken.load import load_tiktoken_bpe
    ranks = load_tiktoken_bpe(path)
    specials = {"<|begin_of_text|>": len(ranks), "<|end_of_text|>": len(ranks) + 1}
    return tiktoken.Encoding(name=name, pat_str=PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def mgbench_tokenize(path, text, *flags):
    proc = subprocess.run([BIN, "tokenize", "--tokenizer", path, *flags], input=text.encode("utf-8"),
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    return [int(t) for t in proc.stdout.split()]


@pytest.mark.parametrize("path", [LLAMA3, SMALL], ids=["llama3", "tiktoken_small"])
def test_agrees_with_tiktoken(path):
    if not os.path.exists(path):
        pytest.skip(f"{path} not found")
    enc = tiktoken_encoding(path, os.path.basename(path))
    for text in CORPUS:
        expected = enc.encode(text, allowed_special=set(), disallowed_special=())
        assert mgbench_tokenize(path, text) == expected, repr(text[:80])
    # The whole corpus as one text: pieces interact across line boundaries.
    whole = "\n".join(CORPUS)
    assert mgbench_tokenize(path, whole) == enc.encode(whole, allowed_special=set(), disallowed_special=())


def test_llama3_known_ids_bos_eos_and_decode():
    if not os.path.exists(LLAMA3):
        pytest.skip("no Llama 3 tokenizer")
    assert mgbench_tokenize(LLAMA3, "Hello world!") == [9906, 1917, 0]
    assert mgbench_tokenize(LLAMA3, "Hello world!", "--bos", "--eos") == [128000, 9906, 1917, 0, 128001]
    text = "Round trip: Zażółć gęślą jaźń 🙂\r\n"
    ids = mgbench_tokenize(LLAMA3, text)
    proc = subprocess.run([BIN, "tokenize", "--tokenizer", LLAMA3, "--decode"], input=" ".join(map(str, ids)).encode(),
                          capture_output=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.decode("utf-8") == text


def test_bad_inputs_name_the_problem(tmp_path):
    bad = tmp_path / "bad.model"
    bad.write_text(base64.b64encode(b"a").decode() + " 0\n" + "not*base64 1\n")
    proc = subprocess.run([BIN, "tokenize", "--tokenizer", str(bad)], input=b"x", capture_output=True)
    assert proc.returncode == 1 and b"bad.model' line 2" in proc.stderr and b"base64" in proc.stderr
    gap = tmp_path / "gap.model"
    gap.write_text(base64.b64encode(b"a").decode() + " 0\n" + base64.b64encode(b"b").decode() + " 5\n")
    proc = subprocess.run([BIN, "tokenize", "--tokenizer", str(gap)], input=b"x", capture_output=True)
    assert proc.returncode == 1 and b"line 2" in proc.stderr and b"out of order" in proc.stderr
    proc = subprocess.run([BIN, "tokenize", "--tokenizer", str(tmp_path / "missing.model")], input=b"x",
                          capture_output=True)
    assert proc.returncode == 1 and b"missing.model" in proc.stderr
    if os.path.exists(SMALL):
        proc = subprocess.run([BIN, "tokenize", "--tokenizer", SMALL], input=b"ok \xff\xfe bytes", capture_output=True)
        assert proc.returncode == 1 and b"UTF-8" in proc.stderr, proc.stderr
    proc = subprocess.run([BIN, "tokenize"], input=b"x", capture_output=True)
    assert proc.returncode == 2 and b"--tokenizer" in proc.stderr
    # A megabyte-long broken token is quoted by its start and length, not whole.
    huge = tmp_path / "huge.model"
    huge.write_text(base64.b64encode(b"a").decode() + " 0\n" + "*" * (1 << 20) + " 1\n")
    proc = subprocess.run([BIN, "tokenize", "--tokenizer", str(huge)], input=b"x", capture_output=True)
    assert proc.returncode == 1 and b"(1048576 characters)" in proc.stderr and len(proc.stderr) < 1000, proc.stderr[:300]
    if os.path.exists(SMALL):
        # Ids outside the vocabulary, 2^32 included (it once wrapped to 0 and decoded as "!").
        for bad_id in ("4294967296", "-1", "999999"):
            proc = subprocess.run([BIN, "tokenize", "--tokenizer", SMALL, "--decode"], input=f"5 {bad_id}".encode(),
                                  capture_output=True)
            assert proc.returncode == 1 and f"id {bad_id} (number 2 on stdin)".encode() in proc.stderr, proc.stderr
            assert proc.stderr.count(b"mgbench tokenize") == 1, proc.stderr  # was "mgbench tokenize: mgbench ..."
        # Options of encoding, with --decode: refused (were ignored).
        for option in ("--bos", "--eos", "--report-speed"):
            proc = subprocess.run([BIN, "tokenize", "--tokenizer", SMALL, "--decode", option], input=b"5",
                                  capture_output=True)
            assert proc.returncode == 2 and f"{option} 'true': only with encoding".encode() in proc.stderr, proc.stderr
