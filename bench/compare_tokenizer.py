#!/usr/bin/env python3
"""Tokenizer speed: `mgbench tokenize` vs tiktoken (PyPI) on the same text, one thread each.

    bench/compare_tokenizer.py [--tokenizer ../shared/data/llama3/tokenizer.model] [--text FILE] [--repeat 3]
    bench/compare_tokenizer.py --long-piece 1000000     # one piece of that many bytes (random DNA letters)

Default text: the alpaca-cleaned sample (../shared/data/text/alpaca), all fields joined. Prints
tokens/s of both and the ratio mgbench / tiktoken (encoding only: file loading excluded on both
sides; best of --repeat runs). Also checks that both produce the same ids.
"""
import argparse
import json
import os
import re
import subprocess
import time

import tiktoken
from tiktoken.load import load_tiktoken_bpe

HERE = os.path.dirname(os.path.abspath(__file__))
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokenizer", default=os.path.join(HERE, "../../shared/data/llama3/tokenizer.model"))
    p.add_argument("--text", default=os.path.join(HERE, "../../shared/data/text/alpaca/alpaca_cleaned_first5k.json"))
    p.add_argument("--mgbench", default=os.path.join(HERE, "../build/app/mgbench"))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--long-piece", type=int, default=0,
                   help="instead of --text: one piece of this many bytes without spaces (seeded random ACGT), "
                        "the worst case of byte-pair merging")
    a = p.parse_args()
    if a.long_piece > 0:
        import random
        rng = random.Random(16)
        raw = "".join(rng.choice("ACGT") for _ in range(a.long_piece))
        a.text = f"a {a.long_piece}-byte DNA piece"
    else:
        raw = open(a.text, encoding="utf-8").read()
    if a.text.endswith(".json"):
        rows = json.loads(raw)
        raw = "\n\n".join(v for row in rows for v in row.values() if isinstance(v, str))
    ranks = load_tiktoken_bpe(a.tokenizer)
    enc = tiktoken.Encoding("llama3", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens={})
    best_tt = float("inf")
    for _ in range(a.repeat):
        t = time.perf_counter()
        expected = enc.encode_ordinary(raw)
        best_tt = min(best_tt, time.perf_counter() - t)
    best_mg, ids = float("inf"), None
    for _ in range(a.repeat):
        proc = subprocess.run([a.mgbench, "tokenize", "--tokenizer", a.tokenizer, "--report-speed"],
                              input=raw.encode("utf-8"), capture_output=True, check=True)
        best_mg = min(best_mg, float(re.search(r" in ([0-9.]+) s", proc.stderr.decode()).group(1)))
        ids = [int(x) for x in proc.stdout.split()]
    assert ids == expected, "mgbench and tiktoken disagree"
    n = len(expected)
    print(f"# {len(raw.encode()):,} bytes of {os.path.basename(a.text)}, {n:,} tokens, best of {a.repeat}, 1 thread each")
    print(f"{'tokenizer':<10} {'tokens/s':>12}")
    print(f"{'mgbench':<10} {n / best_mg:>12,.0f}")
    print(f"{'tiktoken':<10} {n / best_tt:>12,.0f}")
    print(f"ratio mgbench / tiktoken: {best_tt / best_mg:.2f}")


if __name__ == "__main__":
    main()
