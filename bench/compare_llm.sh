#!/usr/bin/env bash
# mgbench llm vs its Python peer (bench/peer_llm.py: transformers + peft + AdamW; for dpo TorchTune's
# lora_dpo step written with them) on the same CPU, in one run: the same small random Llama (made
# here with transformers), the same rows (Llama 3 chat template, tiktoken_small vocabulary; dpo:
# preference pairs) in the same order, batch, precision, LoRA and schedule. Prints real tokens/s
# (dpo: chosen and rejected) and s/it of both (the first two steps left out on both sides: the
# warm-up, and the step whose ATen ops each side counts as torch.profiler does), the ops per step
# and per decoder layer, and the ratio mgbench / peer (> 1: mgbench faster). The peer runs on the
# best-tuned malloc (bench/peer_malloc.sh: TCMalloc; the headline), then on Python's default (glibc's:
# a second row).
#   bench/compare_llm.sh [SHARED_DATA_DIR]
#   RECIPE=dpo bench/compare_llm.sh [SHARED_DATA_DIR]
# Environment: RECIPE (lora | dpo), STEPS (21), BATCH (2 samples, or pairs), PRECISION (fp32), HIDDEN
#   (256), LAYERS (4), DATASET (lora: alpaca; dpo: hh_rlhf, stack_exchange_paired or preference),
#   MAX_SEQ_LEN (lora: 0 = none; dpo: 512), PADDING (mgbench's --padding: pad, the peer's work; none:
#   the real tokens only, packed), MGBENCH (build/app/mgbench), PYTHON (the venv's python with
#   transformers and peft).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/peer_malloc.sh
SHARED=${1:-../shared/data}
RECIPE=${RECIPE:-lora}
STEPS=${STEPS:-21}
BATCH=${BATCH:-2}
PRECISION=${PRECISION:-fp32}
HIDDEN=${HIDDEN:-256}
LAYERS=${LAYERS:-4}
MGBENCH=${MGBENCH:-build/app/mgbench}
PADDING=${PADDING:-pad}
PY=${PYTHON:-${MGBENCH_VENV:-$HOME/.cache/mgbench/venv}/bin/python}
TOKENIZER=$SHARED/llama3/tiktoken_small.model
((STEPS >= 3)) || { echo "compare_llm.sh: STEPS $STEPS: expected 3 or more (two are left out of the timing)" >&2; exit 2; }
case $RECIPE in
  lora)
    DATASET=${DATASET:-alpaca}
    MAX_SEQ_LEN=${MAX_SEQ_LEN:-0}
    RECIPE_ARGS=()
    WHAT="transformers $("$PY" -c 'import transformers; print(transformers.__version__)') + peft"
    UNIT="samples" ;;
  dpo)
    DATASET=${DATASET:-hh_rlhf}
    MAX_SEQ_LEN=${MAX_SEQ_LEN:-512}
    RECIPE_ARGS=(--grad-accum 1 --drop-last false --activation-checkpointing false)
    WHAT="TorchTune's lora_dpo step on transformers $("$PY" -c 'import transformers; print(transformers.__version__)') + peft"
    UNIT="pairs" ;;
  *) echo "compare_llm.sh: RECIPE $RECIPE: expected lora or dpo" >&2; exit 2 ;;
esac
case $DATASET in
  alpaca) DATA=$SHARED/text/alpaca/alpaca_cleaned_first5k.json ;;
  hh_rlhf) DATA=$SHARED/text/dpo/hh_rlhf_harmless_base_test.jsonl.gz ;;
  stack_exchange_paired) DATA=$SHARED/text/dpo/stack_exchange_paired_tiny_torchtune.json ;;
  preference) DATA=$SHARED/text/dpo/dpo_en_demo_llamafactory.json ;;
  *) echo "compare_llm.sh: DATASET $DATASET: expected alpaca (lora), hh_rlhf, stack_exchange_paired or preference (dpo)" >&2
     exit 2 ;;
esac
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

"$PY" bench/llm_peer_common.py "$OUT/model" "$HIDDEN" "$LAYERS"
ROWS=$((STEPS * BATCH))
"$MGBENCH" data stats --dataset "$DATASET" --data "$DATA" --tokenizer "$TOKENIZER" --max-seq-len "$MAX_SEQ_LEN" \
  --dump "$ROWS" >"$OUT/rows.jsonl"
"$MGBENCH" llm --recipe "$RECIPE" --model "$OUT/model" --tokenizer "$TOKENIZER" --dataset "$DATASET" --data "$DATA" \
  --limit "$ROWS" --shuffle false --batch-size "$BATCH" --max-steps "$STEPS" --max-seq-len "$MAX_SEQ_LEN" \
  --precision "$PRECISION" --lora-rank 8 --padding "$PADDING" "${RECIPE_ARGS[@]}" --results "$OUT/r.h5" --progress-interval 1000 \
  --warmup-steps-excluded 2 \
  >"$OUT/mgbench.log" 2>&1 || { tail -20 "$OUT/mgbench.log"; exit 1; }
ours=$("$PY" - "$OUT/r.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    run = list(f["runs"].values())[0]
    steps = run["rank_0"]["steps"][2:]   # the warm-up and the counted step left out
    print(f'{steps["tokens"].sum() / steps["step_s"].sum():.1f} {steps["step_s"].mean():.4f} '
          f'{run["summary"][0]["ops_per_step"]}')
PY
)
# The peer twice: on the best-tuned malloc (the headline) and on Python's default, glibc's.
run_peer() {
  "$PY" bench/peer_llm.py --recipe "$RECIPE" --model "$OUT/model" --rows "$OUT/rows.jsonl" --batch-size "$BATCH" \
    --steps "$STEPS" --precision "$PRECISION" --pad-id 2004 >"$OUT/$1.json" 2>"$OUT/$1.err" ||
    { tail -20 "$OUT/$1.err"; exit 1; }
  "$PY" - "$OUT/$1.json" <<'PY'
import json, sys
d = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print(f'{d["tokens_per_s"]:.1f} {d["s_per_it"]:.4f} {d["ops_per_step"]}')
PY
}
# shellcheck disable=SC2046  # peer_malloc_env's words, one NAME=VALUE each
peer=$(export $(peer_malloc_env "$MGBENCH") && run_peer peer)
peer_glibc=$(run_peer peer_glibc)
read -r ours_tps ours_spi ours_ops <<<"$ours"
read -r peer_tps peer_spi peer_ops <<<"$peer"
read -r glibc_tps glibc_spi glibc_ops <<<"$peer_glibc"
echo "# mgbench llm --recipe $RECIPE vs Python peer ($WHAT), 1 rank, CPU"
echo "# host $(hostname), $(getconf _NPROCESSORS_ONLN) cores, $(date -u +%Y-%m-%dT%H:%MZ); Llama hidden $HIDDEN x $LAYERS layers, vocab 2256, LoRA r 8 (q,v,o,mlp)"
echo "# $DATASET, max_seq_len $MAX_SEQ_LEN, batch $BATCH $UNIT, $PRECISION, $STEPS steps (first two left out), same rows and order"
echo "# mgbench --padding $PADDING (the peer pads each batch to its longest row)"
per_layer() { "$PY" -c "print(f'{$1 / $LAYERS:.0f}')"; }
echo "# peer: tuned malloc ($(peer_malloc_env "$MGBENCH" | cut -d' ' -f1)); peer-glibc: Python's default malloc"
printf "%-11s %12s %10s %10s %10s\n" "" "tokens/s" "s/it" "ops/step" "ops/layer"
printf "%-11s %12s %10s %10s %10s\n" "mgbench" "$ours_tps" "$ours_spi" "$ours_ops" "$(per_layer "$ours_ops")"
printf "%-11s %12s %10s %10s %10s\n" "peer" "$peer_tps" "$peer_spi" "$peer_ops" "$(per_layer "$peer_ops")"
printf "%-11s %12s %10s %10s %10s\n" "peer-glibc" "$glibc_tps" "$glibc_spi" "$glibc_ops" "$(per_layer "$glibc_ops")"
echo "ratio mgbench / peer (tokens/s): $("$PY" -c "print(f'{$ours_tps / $peer_tps:.2f}')")"
echo "ratio mgbench / peer-glibc (tokens/s): $("$PY" -c "print(f'{$ours_tps / $glibc_tps:.2f}')")"
