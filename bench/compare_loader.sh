#!/usr/bin/env bash
# The image loader alone: `mgbench data read-images` (TurboJPEG / libspng decoding, torchvision's
# crop draws and antialiased resize, --loader-threads threads) against torchvision's ImageFolder +
# DataLoader (PIL decoding, the same transforms, num_workers processes) on the same files, in one
# run, alternating, REPEATS times. Prints img/s of each and the ratio mgbench / torchvision
# (> 1: mgbench faster). The files: `mgbench data make-images` of MNIST at SIZE px (JPEG quality 90),
# unless DATA names an imagefolder root (train/<class>/...).
#   bench/compare_loader.sh
# Environment: DATA (a folder; default: made here), SIZE (300: the files), CROP_SIZE (224), CROP (random),
#   THREADS ("1 2": threads = workers), BATCH (64), BATCHES (20), REPEATS (3), MGBENCH (build/app/mgbench),
#   PYTHON (the venv's), IMAGES (4096: files made).
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=${SIZE:-300} CROP_SIZE=${CROP_SIZE:-224} CROP=${CROP:-random} THREADS=${THREADS:-"1 2"} BATCH=${BATCH:-64}
BATCHES=${BATCHES:-20} REPEATS=${REPEATS:-3} MGBENCH=${MGBENCH:-build/app/mgbench} IMAGES=${IMAGES:-4096}
PY=${PYTHON:-${MGBENCH_VENV:-$HOME/.cache/mgbench/venv}/bin/python}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
if [[ -z ${DATA:-} ]]; then
  DATA=$OUT/images
  "$MGBENCH" data make-images --data "${MNIST:-../shared/data/mnist}" --out "$DATA" --image-size "$SIZE" \
    --limit-train "$IMAGES" --limit-test 16 --quality 90 >/dev/null
fi
echo "# image loader alone: mgbench data read-images vs torchvision ImageFolder + DataLoader (uint8 out)"
echo "# host $(hostname), $(getconf _NPROCESSORS_ONLN) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "# files: $DATA ($(find "$DATA/train" -type f | wc -l) training images); crop $CROP to $CROP_SIZE px, batch $BATCH, $BATCHES batches timed"
printf "# %-8s %6s %12s %12s %8s\n" threads run mgbench torchvision ratio
printf "# %-8s %6s %12s %12s %8s\n" "" "" "(img/s)" "(img/s)" ""
rate() { "$PY" -c 'import json, sys; print("%.1f" % json.loads(sys.stdin.readlines()[-1])["img_per_s"])'; }
for t in $THREADS; do
  for r in $(seq "$REPEATS"); do
    ours=$("$MGBENCH" data read-images --data "$DATA" --image-size "$CROP_SIZE" --crop "$CROP" --batch-size "$BATCH" \
      --batches "$BATCHES" --loader-threads "$t" | rate)
    peer=$("$PY" bench/peer_loader.py --data "$DATA" --image-size "$CROP_SIZE" --crop "$CROP" --batch-size "$BATCH" \
      --batches "$BATCHES" --workers "$t" | rate)
    printf "  %-8s %6s %12s %12s %8s\n" "$t" "$r" "$ours" "$peer" "$("$PY" -c "print(f'{$ours / $peer:.2f}')")"
  done
done
