#!/usr/bin/env bash
# Configures and builds mgbench in BUILD_DIR (default: build) against the venv's LibTorch.
#   scripts/build.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."
MGBENCH_VENV=${MGBENCH_VENV:-$HOME/.cache/mgbench/venv}
BUILD_DIR=${BUILD_DIR:-build}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMGBENCH_PYTHON="$MGBENCH_VENV/bin/python" "$@"
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
