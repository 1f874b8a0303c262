#!/usr/bin/env bash
# The house style (.clang-format) on every tracked C++ / CUDA file:
#   scripts/check-format.sh          report files that differ (exit 1), or exit 0
#   scripts/check-format.sh --fix    reformat them in place
# Formatting differs between clang-format releases: the style is pinned to clang-format 14
# (Debian bookworm's, installed by scripts/install-deps.sh). With another release, or none, the
# check says so and exits 77 (ctest: SKIPPED) rather than fail on differences of the tool.
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
PINNED=14
if ! command -v "$CLANG_FORMAT" >/dev/null; then
  echo "SKIPPED: $CLANG_FORMAT not found (scripts/install-deps.sh installs clang-format $PINNED)"
  exit 77
fi
version=$("$CLANG_FORMAT" --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
if [[ $version != "$PINNED" ]]; then
  echo "SKIPPED: $CLANG_FORMAT is version $version; the style is pinned to clang-format $PINNED"
  exit 77
fi
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
if [[ ${1:-} == --fix ]]; then
  "$CLANG_FORMAT" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$CLANG_FORMAT" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "not in the house style (scripts/check-format.sh --fix reformats them):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "format: ${#files[@]} files in the house style"
