#!/usr/bin/env bash
# Configures and builds mgbench in BUILD_DIR (default: build) against the venv's LibTorch.
#   scripts/build.sh [extra cmake -D options]      MGBENCH_TARGETS="mgbench ...": only those targets
# MGBENCH_WERROR=ON|OFF (scripts/test.sh, i.e. CI: ON): warnings in mgbench's own code are errors.
# MGBENCH_SHARED_DATA=DIR: the tests read their inputs there (default ../shared/data).
set -euo pipefail
cd "$(dirname "$0")/.."
MGBENCH_VENV=${MGBENCH_VENV:-$HOME/.cache/mgbench/venv}
BUILD_DIR=${BUILD_DIR:-build}
# ccache: hash paths relative to the checkout, and (NOHASHDIR) not the build directory a -g build
# (RelWithDebInfo) would add, so that a clone elsewhere can hit the cache; a hit's debug info names the
# first build's directory. With the precompiled LibTorch header that is not enough: see MGBENCH_USE_PCH.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# MGBENCH_USE_PCH=OFF (.ci/run): no precompiled LibTorch header, whose bytes differ per clone and made
# every torch object of CI's fresh clone miss ccache; without it a fresh clone hits (a first configure only).
pch=()
[[ -n ${MGBENCH_USE_PCH:-} ]] && pch=(-DMGBENCH_USE_PCH="$MGBENCH_USE_PCH")
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMGBENCH_PYTHON="$MGBENCH_VENV/bin/python" ${pch[@]+"${pch[@]}"} "$@"
fi
if [[ -n ${MGBENCH_WERROR:-} ]] && ! grep -q "^MGBENCH_WERROR:BOOL=$MGBENCH_WERROR\$" "$BUILD_DIR/CMakeCache.txt"; then
  cmake -S . -B "$BUILD_DIR" -DMGBENCH_WERROR="$MGBENCH_WERROR" >/dev/null
fi
# MGBENCH_SHARED_DATA (scripts/test.sh: what scripts/get-test-data.sh found): the tests' input directory,
# absolute and without "." / ".." / a trailing slash (symbolic links kept), as the cache holds it, so
# that the same directory spelt differently does not reconfigure every build.
if [[ -n ${MGBENCH_SHARED_DATA:-} ]]; then
  shared_data=$(realpath -ms -- "$MGBENCH_SHARED_DATA")
  if ! grep -qxF "MGBENCH_SHARED_DATA:PATH=$shared_data" "$BUILD_DIR/CMakeCache.txt"; then
    cmake -S . -B "$BUILD_DIR" -DMGBENCH_SHARED_DATA="$shared_data" >/dev/null
  fi
fi
# MGBENCH_TARGETS: only these targets (scripts/demo.sh builds the binary, not the tests and benchmarks).
targets=()
[[ -n ${MGBENCH_TARGETS:-} ]] && read -r -a targets <<<"$MGBENCH_TARGETS"
cmake --build "$BUILD_DIR" -j "$(nproc)" ${targets[@]+--target "${targets[@]}"}
