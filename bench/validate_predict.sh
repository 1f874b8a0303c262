#!/usr/bin/env bash
# Validates `mgbench predict` on this machine (docs/benchmarks.md, "Scaling predictor"): for each
# strategy and image size, a 1-rank run and a 2-rank run of the same workload, interleaved and
# repeated; one comm run at 2 ranks. Each repeat's 2-rank runs are then predicted from its 1-rank
# runs and the comm run only (they are kept in other files, so the predictor never sees them), and
# each prediction is compared with its measured run by `mgbench report`.
#   bench/validate_predict.sh [OUT_DIR]      (REPEATS=2 SIZES="32 64" STRATEGIES="ddp ddp-rr ddp-ds")
# Every rank gets one core (--threads 1, as a GPU per rank): the model's "own device per rank".
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/validate-predict-$(date -u +%Y%m%dT%H%M%SZ)}
MNIST=${MNIST:-$(scripts/get-mnist.sh | tail -n 1)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=build/app/mgbench
COMMON=(image --data "$MNIST" --limit-train 2048 --limit-test 1024 --epochs 2 --batch-size 32 --width-mult 0.25
  --precision fp32 --threads 1 --progress-interval 1000 --device cpu)
mkdir -p "$OUT"
mpirun -np 2 --bind-to none "$B" comm --min-bytes 1K --max-bytes 16M --results "$OUT/comm.h5" >"$OUT/comm.txt"
for repeat in $(seq "${REPEATS:-2}"); do
  for size in ${SIZES:-32 64}; do
    for strategy in ${STRATEGIES:-ddp ddp-rr ddp-ds}; do
      mpirun -np 1 --bind-to none "$B" "${COMMON[@]}" --image-size "$size" --strategy "$strategy" \
        --results "$OUT/one-rank-$repeat.h5" >/dev/null 2>&1
      mpirun -np 2 --bind-to none "$B" "${COMMON[@]}" --image-size "$size" --strategy "$strategy" \
        --results "$OUT/two-ranks-$repeat.h5" >/dev/null 2>&1
      echo "# repeat $repeat: $strategy $size px" >&2
    done
  done
done
# Each repeat's 2-rank runs predicted from its own 1-rank runs.
for repeat in $(seq "${REPEATS:-2}"); do
  "$B" predict "$OUT/one-rank-$repeat.h5" --comm "$OUT/comm.h5" --ranks 1,2 --results "$OUT/predictions-$repeat.h5" \
    >"$OUT/predict-$repeat.txt"
  echo "# repeat $repeat"
  "$B" report "$OUT/two-ranks-$repeat.h5" "$OUT/one-rank-$repeat.h5" "$OUT/predictions-$repeat.h5" |
    sed -n '/PREDICTIONS/,$p' | grep -v -- '-1r-of-'
done
