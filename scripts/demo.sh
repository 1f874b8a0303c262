#!/usr/bin/env bash
# README command 1: install what is missing, build, then run the main job on MNIST with 2 MPI ranks
# (settings small enough for a 2-core workstation: ~3 min, >= 97 % test accuracy on MNIST), then a
# miniature of the paper's matrix (1 and 2 ranks x ddp, ddp-ds x fp32, fp64 on 1,024 images: ~1.5 min,
# slurm/matrix.sh --local), print the report and write the figures of all of it -- the paper's Fig. 1
# and Table 2 among them -- into outputs/demo-figures/ (index.html to open).
#   scripts/demo.sh [DATA_DIR]
# Without DATA_DIR, scripts/get-mnist.sh finds MNIST: ../shared/data/mnist, else a verified download
# into ~/.cache/mgbench/data, else (no network) Debian's Fashion-MNIST, said so.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
MGBENCH_TARGETS=mgbench scripts/build.sh  # the binary the demo runs, not the tests (~20 min more on 2 cores)
DATA=${1:-$(scripts/get-mnist.sh | tail -n 1)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p outputs && rm -rf outputs/demo-figures
RESULTS=outputs/demo-$(date -u +%Y%m%dT%H%M%SZ).h5  # files of their own per demo: its figures show its runs only
# --limit-train 10000: the same work whichever copy was found (the shared one holds 10,000 images).
mpirun -np 2 --oversubscribe build/app/mgbench image --config inputs/configs/demo-cpu.ini --data "$DATA" \
  --limit-train 10000 --results "$RESULTS"
# The miniature matrix: enough runs for the figures that compare runs (strategy scaling, precision).
MATRIX=${RESULTS%.h5}-matrix
MNIST="$DATA" GPUS="1 2" STRATEGIES="ddp ddp-ds" PRECISIONS="fp32 fp64" PIN=false SIZES=32 OUTPUTS="$MATRIX" \
  slurm/matrix.sh image --local --cpu -- --limit-train 1024 --limit-test 1000 --epochs 1 --progress-interval 1000
build/app/mgbench report --plot outputs/demo-figures "$RESULTS" "$MATRIX"
echo "# data: $DATA; results: $RESULTS and $MATRIX/*/results.h5"
echo "# figures of this demo: outputs/demo-figures/ (open outputs/demo-figures/index.html)"
