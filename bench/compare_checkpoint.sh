#!/usr/bin/env bash
# The cost of preemption safety: the same mgbench image run with a checkpoint every EVERY steps
# against the run without checkpoints (its peer), alternating, REPEATS times, in one invocation.
# Prints wall time (total_s, which includes checkpoint writing), the ratio, and the mean time per
# checkpoint (from the log). The stop agreement (one non-blocking MPI_Iallreduce per step) is on in
# both runs: it is always on.
#   bench/compare_checkpoint.sh [DATA_DIR]
# Environment: NP (2), SIZE (32), TRAIN (2048), BATCH (32), PRECISION (fp32), EVERY (4), REPEATS (3),
#   DEVICE (cpu; cuda: one GPU per rank), THREADS (1), MGBENCH (build/app/mgbench), PYTHON (python3), CKPT_DIR (a temporary
#   directory; point it at the cluster's parallel file system to measure that).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data/mnist}
NP=${NP:-2} SIZE=${SIZE:-32} TRAIN=${TRAIN:-2048} BATCH=${BATCH:-32} PRECISION=${PRECISION:-fp32}
EVERY=${EVERY:-4} REPEATS=${REPEATS:-3} MGBENCH=${MGBENCH:-build/app/mgbench} DEVICE=${DEVICE:-cpu}
THREADS=${THREADS:-1}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=$THREADS
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
CKPT_DIR=${CKPT_DIR:-$OUT/ck}
ARGS=(image --data "$DATA" --image-size "$SIZE" --limit-train "$TRAIN" --limit-test 256 --epochs 1
  --batch-size "$BATCH" --precision "$PRECISION" --threads "$THREADS" --progress-interval 1000 --device "$DEVICE")
PY=${PYTHON:-python3}
# By the column's name: a field before it may hold commas (the GPU model, quoted).
total_s() { "$MGBENCH" report --csv "$1" | "$PY" -c 'import csv, sys; print(next(csv.DictReader(sys.stdin))["total_s"])'; }
printf '%-6s %12s %12s %7s %14s\n' run "plain (s)" "ckpt (s)" ratio "s/checkpoint"
for r in $(seq "$REPEATS"); do
  mpirun -np "$NP" --oversubscribe --bind-to none "$MGBENCH" "${ARGS[@]}" --results "$OUT/plain-$r.h5" >/dev/null 2>&1
  mpirun -np "$NP" --oversubscribe --bind-to none "$MGBENCH" "${ARGS[@]}" --results "$OUT/ckpt-$r.h5" \
    --checkpoint-dir "$CKPT_DIR/$r" --checkpoint-every "$EVERY" >"$OUT/ckpt-$r.log" 2>&1
  plain=$(total_s "$OUT/plain-$r.h5")
  ckpt=$(total_s "$OUT/ckpt-$r.h5")
  per=$(grep -o 'global step [0-9]* -> .* ([0-9.]* s)' "$OUT/ckpt-$r.log" | sed 's/.*(\([0-9.]*\) s)/\1/' |
    awk '{s += $1; n++} END {if (n) printf "%.3f (%d)", s / n, n}')
  printf '%-6s %12s %12s %7.3f %14s\n' "$r" "$plain" "$ckpt" "$(awk -v a="$ckpt" -v b="$plain" 'BEGIN {print a / b}')" "$per"
done
