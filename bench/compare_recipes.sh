#!/usr/bin/env bash
# Every fine-tuning recipe against LoRA, its peer, in one run on the same machine: the same model
# shapes (a preset, random init, so no download), the same alpaca rows in the same order, batch,
# sequence length and precision; 1 rank each, one after the other. Prints per recipe: s/it (mean
# over the steps after the first), its ratio to LoRA's (> 1: slower than LoRA), peak memory (GPU:
# the caching allocator's; CPU: peak resident set) and its ratio to LoRA's, and the model's weight
# bytes (base weights as held: bf16, or NF4 projections) and their ratio to LoRA's.
#   bench/compare_recipes.sh [SHARED_DATA_DIR]
# Environment: MODEL (llama3.2-1b), RECIPES (lora qlora qat-lora full qat), STEPS (4), BATCH (1),
#   MAX_SEQ_LEN (256), PRECISION (bf16), DEVICE (cpu), ACTIVATION_CHECKPOINTING (false: the same for
#   every recipe; TorchTune's configs differ), MGBENCH (build/app/mgbench), PYTHON.
# Each recipe runs with its own defaults (learning rate, schedule), except those fixed here; the
# comparison is of cost, not of what the few steps learn.
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${1:-../shared/data}
MODEL=${MODEL:-llama3.2-1b}
RECIPES=${RECIPES:-lora qlora qat-lora full qat}
STEPS=${STEPS:-4}
BATCH=${BATCH:-1}
MAX_SEQ_LEN=${MAX_SEQ_LEN:-256}
PRECISION=${PRECISION:-bf16}
DEVICE=${DEVICE:-cpu}
ACTIVATION_CHECKPOINTING=${ACTIVATION_CHECKPOINTING:-false}
MGBENCH=${MGBENCH:-build/app/mgbench}
PY=${PYTHON:-${MGBENCH_VENV:-$HOME/.cache/mgbench/venv}/bin/python}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for recipe in $RECIPES; do
  "$MGBENCH" llm --recipe "$recipe" --model "$MODEL" --init random --tokenizer "$SHARED/llama3/tiktoken_small.model" \
    --dataset alpaca --data "$SHARED/text/alpaca/alpaca_cleaned_first5k.json" --limit $((STEPS * BATCH)) \
    --shuffle false --batch-size "$BATCH" --grad-accum 1 --max-steps "$STEPS" --max-seq-len "$MAX_SEQ_LEN" \
    --precision "$PRECISION" --device "$DEVICE" --activation-checkpointing "$ACTIVATION_CHECKPOINTING" --results "$OUT/r.h5" --run-name "$recipe" \
    --progress-interval 1000 >"$OUT/$recipe.log" 2>&1 || { tail -20 "$OUT/$recipe.log"; exit 1; }
done
"$PY" - "$OUT/r.h5" "$MODEL" "$PRECISION" "$DEVICE" "$BATCH" "$MAX_SEQ_LEN" "$ACTIVATION_CHECKPOINTING" <<'PY'
import sys, h5py
path, model, precision, device, batch, seq, ac = sys.argv[1:]
rows = {}
with h5py.File(path, "r") as f:
    for run in f["runs"].values():
        steps = run["rank_0"]["steps"][1:]  # the first step left out (warm-up)
        rows[run.attrs["run_name"]] = (steps["step_s"].mean(), run["summary"][0]["peak_memory_bytes"] / 2**20,
                                       run.attrs["weight_bytes"] / 2**20, run.attrs["trainable_parameters"])
print(f"# {model}, random init, {precision}, {device}, 1 rank, batch {batch}, max_seq_len {seq}, "
      f"activation checkpointing {ac}; ratios to lora")
print(f"# {'recipe':<9} {'s/it':>8} {'ratio':>6} {'peak MiB':>9} {'ratio':>6} {'weights MiB':>11} {'ratio':>6} "
      f"{'trainable':>11}")
base = rows.get("lora")
for name, (s, peak, weights, trainable) in rows.items():
    r = (lambda a, b: f"{a / b:6.3f}") if base else (lambda a, b: "     -")
    print(f"  {name:<9} {s:8.3f} {r(s, base[0]) if base else r(0, 0)} {peak:9.0f} "
          f"{r(peak, base[1]) if base else r(0, 0)} {weights:11.1f} {r(weights, base[2]) if base else r(0, 0)} "
          f"{trainable:11d}")
PY
