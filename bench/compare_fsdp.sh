#!/usr/bin/env bash
# FSDP on the CPU, 2 ranks, in one run: `mgbench llm --sharding fsdp` against `--sharding none` (the
# same recipe: full, lora or qlora), and for full fine-tuning against torch's own fully_shard
# (bench/peer_fsdp.py: transformers' Llama, FSDP2 over gloo, TorchTune's units, AdamW), all on the
# same small random Llama (made here with transformers), the same rows per rank (mgbench's
# --record-indices) and steps. Prints real tokens/s of all ranks and s/it (the first step left out),
# rank 0's peak resident memory, and the ratios.
#   bench/compare_fsdp.sh [SHARED_DATA_DIR]
# Environment: RECIPE (full | lora | qlora; full), STEPS (11), BATCH (2), HIDDEN (512), LAYERS (8),
#   INTERMEDIATE (the MLP: 2.6875 x HIDDEN; qlora 2.75 x HIDDEN, so that the NF4 projections hold
#   quantisation blocks of 16,384 weights in numbers 2 ranks divide), MAX_SEQ_LEN (256),
#   MGBENCH (build/app/mgbench), PYTHON (the venv's python).
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${1:-../shared/data}
RECIPE=${RECIPE:-full}
STEPS=${STEPS:-11}
BATCH=${BATCH:-2}
HIDDEN=${HIDDEN:-512}
LAYERS=${LAYERS:-8}
MAX_SEQ_LEN=${MAX_SEQ_LEN:-256}
MGBENCH=${MGBENCH:-build/app/mgbench}
PY=${PYTHON:-${MGBENCH_VENV:-$HOME/.cache/mgbench/venv}/bin/python}
TOKENIZER=$SHARED/llama3/tiktoken_small.model
DATA=$SHARED/text/alpaca/alpaca_cleaned_first5k.json
case $RECIPE in full | lora | qlora) ;; *) echo "compare_fsdp.sh: RECIPE $RECIPE: expected full, lora or qlora" >&2; exit 2 ;; esac
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

INTERMEDIATE=${INTERMEDIATE:-$([[ $RECIPE == qlora ]] && echo $((HIDDEN * 11 / 4)) || echo 0)}
"$PY" bench/llm_peer_common.py "$OUT/model" "$HIDDEN" "$LAYERS" "$INTERMEDIATE"
ROWS=$((2 * STEPS * BATCH))
"$MGBENCH" data stats --dataset alpaca --data "$DATA" --tokenizer "$TOKENIZER" --max-seq-len "$MAX_SEQ_LEN" \
  --dump "$ROWS" >"$OUT/rows.jsonl"
COMMON=(llm --recipe "$RECIPE" --model "$OUT/model" --tokenizer "$TOKENIZER" --dataset alpaca --data "$DATA"
  --limit "$ROWS" --max-seq-len "$MAX_SEQ_LEN" --shuffle false --batch-size "$BATCH" --grad-accum 1
  --max-steps "$STEPS" --lr 1e-4 --weight-decay 0.01 --lr-schedule constant --warmup-steps 0 --precision fp32
  --activation-checkpointing false --threads 1 --device cpu --record-indices --progress-interval 1000)
for sharding in fsdp none; do
  mpirun -np 2 --bind-to none "$MGBENCH" "${COMMON[@]}" --sharding "$sharding" --results "$OUT/$sharding.h5" \
    >"$OUT/$sharding.log" 2>&1 || { tail -20 "$OUT/$sharding.log"; exit 1; }
done
measure() {  # tokens/s of all ranks, s/it and rank 0's peak memory [MiB] of a results file
  "$PY" - "$1" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    run = list(f["runs"].values())[0]
    steps = [run[f"rank_{r}"]["steps"][1:] for r in (0, 1)]   # the first step left out (warm-up)
    tokens = sum(int(s["tokens"].sum()) for s in steps)
    seconds = float(steps[0]["step_s"].sum())
    print(f'{tokens / seconds:.1f} {steps[0]["step_s"].mean():.4f} {run["summary"][0]["peak_memory_bytes"] / 2**20:.0f}')
PY
}
read -r fsdp_tps fsdp_spi fsdp_mib <<<"$(measure "$OUT/fsdp.h5")"
read -r none_tps none_spi none_mib <<<"$(measure "$OUT/none.h5")"
echo "# mgbench llm --recipe $RECIPE, 2 ranks x 1 thread, CPU: --sharding fsdp vs none$([[ $RECIPE == full ]] && echo ", and torch's fully_shard")"
echo "# host $(hostname), $(getconf _NPROCESSORS_ONLN) cores, $(date -u +%Y-%m-%dT%H:%MZ); Llama hidden $HIDDEN x $LAYERS layers, vocab 2256, fp32, AdamW"
echo "# alpaca, max_seq_len $MAX_SEQ_LEN, batch $BATCH per rank, $STEPS steps (first left out), the same rows per rank"
printf "%-22s %12s %10s %16s\n" "" "tokens/s" "s/it" "peak MiB rank 0"
printf "%-22s %12s %10s %16s\n" "mgbench fsdp" "$fsdp_tps" "$fsdp_spi" "$fsdp_mib"
printf "%-22s %12s %10s %16s\n" "mgbench none" "$none_tps" "$none_spi" "$none_mib"
ratio() { "$PY" -c "print(f'{$1 / $2:.2f}')"; }
echo "fsdp / none: tokens/s $(ratio "$fsdp_tps" "$none_tps"), peak memory $(ratio "$fsdp_mib" "$none_mib")"
[[ $RECIPE == full ]] || exit 0
"$PY" - "$OUT/fsdp.h5" "$OUT/indices.json" <<'PY'
import json, sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    run = list(f["runs"].values())[0]
    json.dump({r: [int(i) for i in run[f"rank_{r}"]["indices"][0]] for r in (0, 1)}, open(sys.argv[2], "w"))
PY
mkdir "$OUT/peer"
"$PY" -m torch.distributed.run --standalone --nproc-per-node 2 bench/peer_fsdp.py --model "$OUT/model" \
  --rows "$OUT/rows.jsonl" --indices "$OUT/indices.json" --batch-size "$BATCH" --steps "$STEPS" --lr 1e-4 \
  --weight-decay 0.01 --pad-id 2004 --out "$OUT/peer" >"$OUT/peer.log" 2>&1 || { tail -20 "$OUT/peer.log"; exit 1; }
read -r peer_tps peer_spi peer_mib <<<"$("$PY" - "$OUT/peer" <<'PY'
import json, sys
ranks = [json.load(open(f"{sys.argv[1]}/rank-{r}.json")) for r in (0, 1)]
tokens = sum(sum(r["tokens"][1:]) for r in ranks)
seconds = sum(ranks[0]["step_s"][1:])
print(f'{tokens / seconds:.1f} {seconds / (len(ranks[0]["step_s"]) - 1):.4f} {ranks[0]["peak_memory_bytes"] / 2**20:.0f}')
PY
)"
printf "%-22s %12s %10s %16s\n" "torch fully_shard" "$peer_tps" "$peer_spi" "$peer_mib"
echo "mgbench fsdp / torch fully_shard: tokens/s $(ratio "$fsdp_tps" "$peer_tps"), peak memory $(ratio "$fsdp_mib" "$peer_mib")"
