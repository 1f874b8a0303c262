#!/usr/bin/env bash
# README command 1: install what is missing, build, then run the main job on real MNIST with
# 2 MPI ranks (settings small enough for a 2-core workstation: ~3 min, >= 97 % test accuracy),
# and print the report.
#   scripts/demo.sh [DATA_DIR]      (default ../shared/data/mnist)
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data/mnist}
scripts/install-deps.sh
scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p outputs
mpirun -np 2 --oversubscribe build/app/mgbench image --config inputs/configs/demo-cpu.ini --data "$DATA" \
  --results outputs/demo.h5
build/app/mgbench report outputs/demo.h5
