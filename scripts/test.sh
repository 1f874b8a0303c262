#!/usr/bin/env bash
# README command 2: install what is missing, build, run every test (unit, mpi, e2e, slurm).
#   scripts/test.sh [ctest options, e.g. -L unit]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
MGBENCH_WERROR=${MGBENCH_WERROR:-ON} scripts/build.sh  # CI builds treat mgbench's own warnings as errors
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # CI runs as root
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
