#!/usr/bin/env bash
# mgbench image vs its Python torch peer (bench/peer_image.py) on the same machine, in one run:
# same model (MobileNetV2, width 1.0), image size, per-rank batch, precision, ranks, samples,
# threads per rank. mgbench in both memory layouts (NHWC, its default, and NCHW: --channels-last
# false); three peers: as the paper's users write it (default memory layout, NCHW), tuned
# (channels_last, as mgbench), and tuned with the best host malloc too (bench/peer_malloc.sh: TCMalloc
# preloaded, or glibc's thresholds of --malloc-reuse without it). Prints img/s and the ratios
# mgbench / peer (> 1: mgbench faster): NHWC vs the plain peer, NHWC vs NHWC, NCHW vs NCHW. mgbench
# runs with --cupti false, as the peer is untraced; on a GPU a second mgbench run with CUPTI (its
# default there) gives CUPTI's own cost as a ratio.
#   bench/compare_image.sh [DATA_DIR]
# Environment: SIZES ("32 64"), NP (2), BATCH (32), TRAIN (2048), EPOCHS (1), PRECISION (fp32),
#   THREADS (1 per rank), DEVICE (cpu | cuda), PIN (false), MGBENCH (build/app/mgbench), WARMUP (0: the
#   first WARMUP steps, cuDNN's autotuning among them, left out of every side's img/s), DATASET (mnist |
#   imagefolder: DATA_DIR holds train/ and val/ of image files), MODEL (mobilenet_v2 | resnet50), WORKERS
#   (imagefolder: mgbench's --loader-threads and the peer's DataLoader num_workers), QUICK (1: neither the
#   +malloc peer nor the CUPTI-traced mgbench run),
#   PYTHON (the interpreter with torch/torchvision; default: the venv of MGBENCH_VENV), TUNED_PEER (0; 1 with mnist:
#   two rows under each size's line, the headline first: mgbench vs the best-tuned peer -- TUNED_WORKERS (8) DataLoader
#   workers, channels_last, the digits resized on the device (--gpu-resize) -- then vs the paper-style peer,
#   the table's "peer": WORKERS (0) workers, torchvision's Resize on the host).
# On a GPU machine (scripts/gpu-check.sh): DEVICE=cuda NP=1 SIZES="224 500" PRECISION=amp-bf16 ...
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/peer_malloc.sh
DATA=${1:-../shared/data/mnist}
SIZES=${SIZES:-"32 64"}
NP=${NP:-2}
BATCH=${BATCH:-32}
TRAIN=${TRAIN:-2048}
EPOCHS=${EPOCHS:-1}
PRECISION=${PRECISION:-fp32}
THREADS=${THREADS:-1}
MGBENCH=${MGBENCH:-build/app/mgbench}
DEVICE=${DEVICE:-cpu}
PIN=${PIN:-false}
WARMUP=${WARMUP:-0}
PY=${PYTHON:-${MGBENCH_VENV:-$HOME/.cache/mgbench/venv}/bin/python}
DATASET=${DATASET:-mnist}
MODEL=${MODEL:-mobilenet_v2}
PEER_ARGS=(--device "$DEVICE" --warmup-steps "$WARMUP" --dataset "$DATASET" --model "$MODEL" --workers "${WORKERS:-0}")
# imagefolder (DATA: train/ and val/ of JPEG / PNG files): mgbench decodes on --loader-threads WORKERS,
# the peer's DataLoader on num_workers WORKERS processes.
MGBENCH_ARGS=(--dataset "$DATASET" --model "$MODEL")
[[ $DATASET == imagefolder ]] && MGBENCH_ARGS+=(--loader-threads "${WORKERS:-1}")
[[ $PIN == true ]] && PEER_ARGS+=(--pin-memory)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=$THREADS
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

echo "# mgbench image vs Python torch peer (torchvision $MODEL + $DATASET DataLoader + DistributedSampler + DDP)"
[[ $DEVICE == cuda ]] && echo "# $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), pin_memory $PIN"
echo "# host $(hostname), $(getconf _NPROCESSORS_ONLN) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "# ranks $NP, batch $BATCH per rank, $TRAIN training images, $EPOCHS epoch(s), $PRECISION, $THREADS thread(s) per rank, first $WARMUP step(s) not timed"
printf "# %-4s %12s %12s %12s %12s %12s %8s %8s %8s %8s %12s %8s\n" "size" "mgbench" "mgbench-nchw" "peer" "peer-nhwc" \
  "nhwc+malloc" "ratio" "ratio" "ratio" "ratio" "mgbench" "cupti"
printf "# %-4s %12s %12s %12s %12s %12s %8s %8s %8s %8s %12s %8s\n" "(px)" "(img/s)" "(img/s)" "(img/s)" "(img/s)" \
  "(img/s)" "(peer)" "(nhwc)" "(nchw)" "(+malloc)" "+cupti" "(ratio)"
for size in $SIZES; do
  mgbench_img_per_s() {  # CUPTI on or off, the memory layout (--channels-last); the run's img/s
    mpirun -np "$NP" --oversubscribe --bind-to none "$MGBENCH" image --data "$DATA" --image-size "$size" \
      --batch-size "$BATCH" --limit-train "$TRAIN" --limit-test 64 --epochs "$EPOCHS" --precision "$PRECISION" \
      "${MGBENCH_ARGS[@]}" --warmup-steps-excluded "$WARMUP" --threads "$THREADS" --device "$DEVICE" \
      --pin-memory "$PIN" --cupti "$1" --channels-last "$2" \
      --results "$OUT/mgbench.h5" --run-name "s$size-cupti-$1-nhwc-$2" --progress-interval 1000 >"$OUT/mgbench.log" 2>&1 ||
      { echo "mgbench failed (--cupti $1 --channels-last $2):" >&2; grep -v "^#" "$OUT/mgbench.log" | tail -15 >&2; exit 1; }
    "$PY" - "$OUT/mgbench.h5" "s$size-cupti-$1-nhwc-$2" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    run = [f["runs"][k] for k in f["runs"] if k.endswith("_" + sys.argv[2])][-1]
    print(f'{run["summary"][0]["samples_per_s"]:.2f}')
PY
  }
  ours=$(mgbench_img_per_s false true)
  ours_nchw=$(mgbench_img_per_s false false)
  traced=-
  [[ $DEVICE == cuda && ${QUICK:-0} != 1 ]] && traced=$(mgbench_img_per_s true true)
  peer_failed() {  # the rank's own traceback, not only torchrun's summary of it
    echo "peer failed:" >&2
    grep -m1 -A25 "^Traceback\|Error" "$OUT/peer.err" >&2 || tail -20 "$OUT/peer.err" >&2
    exit 1
  }
  peer() {
    timeout 900 "$PY" -m torch.distributed.run --standalone --nproc_per_node "$NP" bench/peer_image.py --data "$DATA" \
      --image-size "$size" --batch-size "$BATCH" --limit-train "$TRAIN" --epochs "$EPOCHS" --precision "$PRECISION" \
      --threads "$THREADS" "${PEER_ARGS[@]}" "$@" 2>"$OUT/peer.err" | "$PY" -c 'import json, sys; print("%.2f" % json.loads(sys.stdin.readlines()[-1])["img_per_s"])'
  }
  if ! plain=$(peer); then peer_failed; fi
  if ! nhwc=$(peer --channels-last); then peer_failed; fi
  reuse=-
  # shellcheck disable=SC2046  # peer_malloc_env's words, one NAME=VALUE each
  if [[ ${QUICK:-0} != 1 ]] && ! reuse=$(export $(peer_malloc_env "$MGBENCH") && peer --channels-last); then
    peer_failed
  fi
  ratio() { "$PY" -c "print(f'{$1 / $2:.2f}')"; }
  printf "%-6s %12s %12s %12s %12s %12s %8s %8s %8s %8s %12s %8s\n" "$size" "$ours" "$ours_nchw" "$plain" "$nhwc" \
    "$reuse" "$(ratio "$ours" "$plain")" "$(ratio "$ours" "$nhwc")" "$(ratio "$ours_nchw" "$plain")" \
    "$([[ $reuse == - ]] && echo - || ratio "$ours" "$reuse")" "$traced" \
    "$([[ $traced == - ]] && echo - || ratio "$traced" "$ours")"
  # Against the paper-style peer mgbench measures the peer's host resize (5.6x at 224 px on an H200),
  # not the training; the headline is the ratio against the peer tuned as far as a user would tune it.
  if [[ ${TUNED_PEER:-0} == 1 && $DATASET == mnist ]]; then
    if ! tuned=$(peer --channels-last --workers "${TUNED_WORKERS:-8}" --gpu-resize); then peer_failed; fi
    printf "%-6s %-58s %12s %8s\n" "$size" "headline: mgbench vs the tuned peer (${TUNED_WORKERS:-8} workers, NHWC, GPU resize)" \
      "$tuned" "$(ratio "$ours" "$tuned")"
    printf "%-6s %-58s %12s %8s\n" "$size" "mgbench vs the paper-style peer (${WORKERS:-0} workers, host resize)" "$plain" \
      "$(ratio "$ours" "$plain")"
  fi
done
