#!/usr/bin/env bash
# Quantisation kernels, mgbench vs torchao 0.11 on the same CPU in one run (bench/micro_quant.cpp
# and bench/peer_quant.py: NF4 quantise / dequantise of Llama 3.2 1B's projection shapes and one
# 8da4w fake-quantised linear's forward + backward, bf16). Prints each side's ms per call and the
# ratio peer / mgbench (> 1: mgbench faster).
#   bench/compare_quant.sh
# Environment: THREADS (all cores), MIN_TIME (1.0 s per benchmark), BUILD (build), PYTHON (the venv's
#   python; torchao from its torchtune-site folder, as scripts/install-deps.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
THREADS=${THREADS:-$(nproc)}
MIN_TIME=${MIN_TIME:-1.0}
PY=${PYTHON:-${MGBENCH_VENV:-$HOME/.cache/mgbench/venv}/bin/python}
SITE=$(dirname "$(dirname "$PY")")/torchtune-site
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
OMP_NUM_THREADS=$THREADS "$BUILD/bench/mgbench_micro" --benchmark_filter='Nf4|QatLinear' \
  --benchmark_min_time="$MIN_TIME" --benchmark_format=json >"$OUT/ours.json"
PYTHONPATH=$SITE OMP_NUM_THREADS=$THREADS "$PY" bench/peer_quant.py --threads "$THREADS" --min-time "$MIN_TIME" \
  >"$OUT/peer.json"
"$PY" - "$OUT/ours.json" "$OUT/peer.json" "$THREADS" <<'PY'
import json, sys
ours = {b["name"]: b["real_time"] for b in json.load(open(sys.argv[1]))["benchmarks"]}
peer = json.load(open(sys.argv[2]))
print(f"# quantisation kernels, bf16, CPU, {sys.argv[3]} thread(s); ms per call (mean); ratio = torchao / mgbench")
print(f"# {'benchmark':<30} {'mgbench':>9} {'torchao':>9} {'ratio':>7}")
for name, theirs in peer.items():
    mine = ours[name]
    print(f"  {name:<30} {mine:>9.3f} {theirs:>9.3f} {theirs / mine:>7.2f}")
PY
