#!/usr/bin/env bash
# Fuzzes mgbench's parsers with libFuzzer (tests/fuzz, docs/reliability.md).
#   scripts/fuzz.sh [--seconds N] [--build-only | --no-build] [TARGET ...]
# TARGETs: idx records tiktoken safetensors ini results images tar (default: all). Builds build-fuzz/ with
# clang (-fsanitize=fuzzer,address,undefined), then runs each target for N seconds (default 60)
# from its seed corpus (tests/fuzz/corpus/<target>) into a working corpus that grows across runs
# (build-fuzz/corpus/<target>). A finding -- a crash, a sanitizer report, an exception other than
# mgbench's errors, a run over 10 s, over 2 GB -- stops that target; its input is written to
# build-fuzz/findings/<target>/ and the script exits 1. Exit 77: no clang here (ctest: SKIPPED).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=60
BUILD_ONLY=0
NO_BUILD=0
TARGETS=()
while (($#)); do
  case "$1" in
    --seconds) SECONDS_PER_TARGET=$2; shift 2 ;;
    --build-only) BUILD_ONLY=1; shift ;;
    --no-build) NO_BUILD=1; shift ;;  # ctest: the fuzz_build fixture built them
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
((${#TARGETS[@]})) || TARGETS=(idx records tiktoken safetensors ini results images tar)
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}

if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found (scripts/install-deps.sh installs clang and libFuzzer)" >&2
  exit 77
fi
if ((!NO_BUILD)); then
  if [[ ! -f "$BUILD/build.ninja" ]]; then
    cmake -S tests/fuzz -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang >/dev/null
  fi
  cmake --build "$BUILD" -j "$(nproc)" >/dev/null
fi
((BUILD_ONLY)) && exit 0

status=0
for t in "${TARGETS[@]}"; do
  corpus="$BUILD/corpus/$t"
  findings="$BUILD/findings/$t"
  mkdir -p "$corpus" "$findings"
  log="$BUILD/fuzz_$t.log"
  # Options: inputs up to 64 KiB; 10 s per input; 2 GB RSS, 1 GB per allocation (an untrusted
  # size taken for an allocation is a finding); the seeds read, not written to.
  tmp="$BUILD/tmp/$t"
  rm -rf "$tmp" && mkdir -p "$tmp"
  if TMPDIR="$(realpath "$tmp")" "$BUILD/fuzz_$t" "$corpus" "tests/fuzz/corpus/$t" -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 \
    -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -artifact_prefix="$findings/" -print_final_stats=1 \
    >"$log" 2>&1; then
    echo "fuzz_$t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$') inputs" \
      "in ${SECONDS_PER_TARGET} s, corpus $(find "$corpus" -type f | wc -l) files, no finding"
  else
    status=1
    echo "fuzz_$t: FINDING (log: $log, input: $(ls -t "$findings" | head -1))" >&2
    grep -E "ERROR:|SUMMARY|terminate|what\(\)" "$log" | head -5 >&2 || true
  fi
  rm -rf "$tmp"
done
exit $status
