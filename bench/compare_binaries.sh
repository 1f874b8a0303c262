#!/usr/bin/env bash
# Two mgbench binaries (a commit before a change and after it) on the same commands: do they compute
# the same? Each runs, on 2 CPU ranks: image fp32, amp-fp16 and ddp-rr with --grad-accum 2 and
# clipping, a 1-rank image run, an image run with --sharding fsdp, LoRA (FSDP, the LLM recipes'
# default; grad-accum 1, and 2 with activation checkpointing) and DPO for 4 steps, `mgbench comm`
# over every collective, `mgbench predict`; then both reports read both results files. Compared bitwise:
# the step losses, learning rates, loss scales, batch indices and test accuracy, DPO's metrics, the
# adapters' tensors (tests/python/equivalence_dump.py), the comm #wrong columns, the predictions
# (the old binary's predictor on both files' runs), and `mgbench report --csv` of each file by both
# reports. Exits 1 and shows the difference when anything differs. Timings are not compared.
#   bench/compare_binaries.sh OLD_MGBENCH NEW_MGBENCH [SHARED_DATA_DIR]
# Environment: MGBENCH_ORACLE_DIR (the tiny Llama of tests/python/make_oracles.py; default
#   build/tests/oracles), PYTHON (the venv's), OUT (a scratch directory; default a temporary one).
set -euo pipefail
cd "$(dirname "$0")/.."
OLD=$(realpath "$1") NEW=$(realpath "$2")
SHARED=$(realpath "${3:-../shared/data}")
ORACLES=${MGBENCH_ORACLE_DIR:-build/tests/oracles}
PY=${PYTHON:-${MGBENCH_VENV:-$HOME/.cache/mgbench/venv}/bin/python}
OUT=${OUT:-$(mktemp -d)}
[[ -d "$ORACLES/llama_tiny_2256" ]] || { echo "compare_binaries: no $ORACLES/llama_tiny_2256 (ctest -R oracles, or set MGBENCH_ORACLE_DIR)" >&2; exit 2; }
export OMPI_MCA_rmaps_base_oversubscribe=1
run_all() {  # run_all BIN DIR
  local bin=$1 dir=$2 r=$2/r.h5
  mkdir -p "$dir"
  local image=(--data "$SHARED/mnist" --image-size 32 --width-mult 0.25 --threads 1 --progress-interval 1000
    --device cpu --limit-train 512 --limit-test 200 --epochs 2 --batch-size 32 --results "$r")
  local llm=(--model "$ORACLES/llama_tiny_2256" --tokenizer "$SHARED/llama3/tiktoken_small.model" --precision fp32
    --device cpu --progress-interval 1000 --batch-size 2 --max-steps 4 --warmup-steps 2 --lora-rank 4 --results "$r")
  local alpaca=(--dataset alpaca --data "$SHARED/text/alpaca/alpaca_cleaned_first5k.json" --limit 48)
  {
    mpirun -np 2 "$bin" image "${image[@]}" --precision fp32 --run-name img-fp32
    mpirun -np 2 "$bin" image "${image[@]}" --precision amp-fp16 --run-name img-amp
    mpirun -np 2 "$bin" image "${image[@]}" --strategy ddp-rr --grad-accum 2 --clip-grad-norm 1 --run-name img-rr
    mpirun -np 1 "$bin" image "${image[@]}" --precision fp32 --run-name img-1r
    mpirun -np 2 "$bin" image "${image[@]}" --sharding fsdp --run-name img-fsdp
    mpirun -np 2 "$bin" llm --recipe lora "${llm[@]}" "${alpaca[@]}" --output-dir "$dir/lora" --run-name lora
    mpirun -np 2 "$bin" llm --recipe lora "${llm[@]}" "${alpaca[@]}" --grad-accum 2 --activation-checkpointing true \
      --output-dir "$dir/lora2" --run-name lora2
    mpirun -np 2 "$bin" llm --recipe dpo "${llm[@]}" --grad-accum 1 --dataset hh_rlhf \
      --data "$SHARED/text/dpo/hh_rlhf_harmless_base_test.jsonl.gz" --limit 32 --max-seq-len 0 \
      --activation-checkpointing false --output-dir "$dir/dpo" --run-name dpo
    mpirun -np 2 "$bin" comm --collective all --min-bytes 8 --max-bytes 256K --device cpu --results "$r" --run-name comm
  } >"$dir/log.txt" 2>&1 || { echo "compare_binaries: $bin failed: see $dir/log.txt" >&2; exit 1; }
}
run_all "$OLD" "$OUT/old"
run_all "$NEW" "$OUT/new"
status=0
same() {  # same WHAT FILE_A FILE_B
  if diff -q "$2" "$3" >/dev/null; then echo "same: $1"; else echo "DIFFERENT: $1"; diff "$2" "$3" | head -20; status=1; fi
}
for side in old new; do
  # Run ids carry the time: masked.
  "$PY" tests/python/equivalence_dump.py "$OUT/$side" | sed 's/[0-9]\{8\}T[0-9]\{6\}Z/<time>/g' >"$OUT/$side.dump"
  "$OLD" predict "$OUT/$side/r.h5" --ranks 1,2,3 --link h100-nvlink --results "$OUT/$side-p-old.h5" | grep -v '^# [0-9]* pred' |
    sed "s#$OUT/$side#<dir>#g; s/[0-9]\{8\}T[0-9]\{6\}Z/<time>/g" >"$OUT/$side.predict-old"
  "$NEW" predict "$OUT/$side/r.h5" --ranks 1,2,3 --link h100-nvlink --results "$OUT/$side-p-new.h5" | grep -v '^# [0-9]* pred' |
    sed "s#$OUT/$side#<dir>#g; s/[0-9]\{8\}T[0-9]\{6\}Z/<time>/g" >"$OUT/$side.predict-new"
  same "predictions from the $side runs" "$OUT/$side.predict-old" "$OUT/$side.predict-new"
  "$OLD" report --csv "$OUT/$side/r.h5" >"$OUT/$side.csv-old"
  "$NEW" report --csv "$OUT/$side/r.h5" >"$OUT/$side.csv-new"
  same "report --csv of the $side file" "$OUT/$side.csv-old" "$OUT/$side.csv-new"
done
same "losses, accuracies, metrics, adapters, comm checks" "$OUT/old.dump" "$OUT/new.dump"
echo "# outputs in $OUT"
exit $status
