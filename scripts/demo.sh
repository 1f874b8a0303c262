#!/usr/bin/env bash
# README command 1: install what is missing, build, then run the main job on MNIST with 2 MPI ranks
# (settings small enough for a 2-core workstation: ~3 min, >= 97 % test accuracy on MNIST), print
# the report and write the figures of the run into outputs/demo-figures/ (index.html to open).
#   scripts/demo.sh [DATA_DIR]
# Without DATA_DIR, scripts/get-mnist.sh finds MNIST: ../shared/data/mnist, else a verified download
# into ~/.cache/mgbench/data, else (no network) Debian's Fashion-MNIST, said so.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
DATA=${1:-$(scripts/get-mnist.sh | tail -n 1)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p outputs && rm -rf outputs/demo-figures
RESULTS=outputs/demo-$(date -u +%Y%m%dT%H%M%SZ).h5  # a file per demo: its figures show its run only
# --limit-train 10000: the same work whichever copy was found (the shared one holds 10,000 images).
mpirun -np 2 --oversubscribe build/app/mgbench image --config inputs/configs/demo-cpu.ini --data "$DATA" \
  --limit-train 10000 --results "$RESULTS"
build/app/mgbench report --plot outputs/demo-figures "$RESULTS"
echo "# data: $DATA; results: $RESULTS"
echo "# figures of this run: outputs/demo-figures/ (open outputs/demo-figures/index.html)"
