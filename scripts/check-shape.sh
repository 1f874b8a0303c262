#!/usr/bin/env bash
# The code's shape (docs/design.md, "Layout"): no file of modules/ or app/ over 600 lines, no
# function over 120 lines (lizard's count, comments and blank lines included). Prints each
# offender and exits 1; SKIPPED (77) without lizard (scripts/install-deps.sh installs it).
#   scripts/check-shape.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-${MGBENCH_PYTHON:-$HOME/.cache/mgbench/venv/bin/python}}
MAX_FILE_LINES=600
MAX_FUNCTION_LINES=120
if ! "$PY" -c "import lizard" 2>/dev/null; then
  echo "SKIPPED: lizard not importable by $PY (scripts/install-deps.sh installs it)"
  exit 77
fi
status=0
mapfile -t files < <(git ls-files 'modules/*.cpp' 'modules/*.h' 'app/*.cpp' 'app/*.h')
for f in "${files[@]}"; do
  n=$(wc -l <"$f")
  if ((n > MAX_FILE_LINES)); then
    echo "$f: $n lines (at most $MAX_FILE_LINES)"
    status=1
  fi
done
# -L: function length; -C and -a so high that only the length warns.
if ! "$PY" -m lizard -l cpp -L "$MAX_FUNCTION_LINES" -C 100000 -a 1000 -w "${files[@]}"; then
  echo "(functions over $MAX_FUNCTION_LINES lines above)"
  status=1
fi
((status == 0)) && echo "shape: ${#files[@]} files of modules/ and app/, none over $MAX_FILE_LINES lines, no function over $MAX_FUNCTION_LINES"
exit $status
