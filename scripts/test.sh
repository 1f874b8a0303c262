#!/usr/bin/env bash
# README command 2: install what is missing, build, run every test (unit, mpi, e2e, slurm).
#   scripts/test.sh [ctest options, e.g. -L unit]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# The suite's real inputs (MNIST, tokenizers, text sets, a tiny Llama): the team's ../shared/data, or a
# cache fetched from their public upstreams (scripts/get_test_data.py). Without them the tests that
# read them skip, naming the path -- and in CI (MGBENCH_CI=1) the run stops here.
if data=$(scripts/get-test-data.sh | tail -n 1) && [[ -n $data ]]; then
  export MGBENCH_SHARED_DATA=$data
elif [[ ${MGBENCH_CI:-} == 1 ]]; then
  echo "test.sh: the suite's inputs are missing (above); CI needs all of them" >&2
  exit 1
else
  echo "test.sh: going on without the suite's inputs: the tests that read them will be SKIPPED" >&2
fi
MGBENCH_WERROR=${MGBENCH_WERROR:-ON} scripts/build.sh  # CI builds treat mgbench's own warnings as errors
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # CI runs as root
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
