#!/usr/bin/env bash
# The code's shape (docs/design.md, "Layout"): includes run down the layers only (each folder of
# modules/ includes the folders below it, listed here), no file of modules/ or app/ over 450 lines,
# no function over 100 lines (lizard's count, comments and blank lines included), and no function of
# the training loop's folders (modules/train and below) with more than 5 parameters (the loop's
# state goes by named stages, not by long argument lists). Prints each offender and exits 1;
# SKIPPED (77) without lizard (scripts/install-deps.sh installs it).
#   scripts/check-shape.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-${MGBENCH_PYTHON:-$HOME/.cache/mgbench/venv/bin/python}}
MAX_FILE_LINES=450
MAX_FUNCTION_LINES=100
MAX_TRAIN_PARAMETERS=5
if ! "$PY" -c "import lizard" 2>/dev/null; then
  echo "SKIPPED: lizard not importable by $PY (scripts/install-deps.sh installs it)"
  exit 77
fi
status=0
# What each folder may include besides itself (the arrows of docs/design.md's map).
declare -A below=(
  [core]=""
  [axes]="core"
  [results]="core"
  [report]="core axes results"
  [profile]="core results"
  [runtime]="core axes profile"
  [session]="core results runtime"
  [comm]="core axes results runtime session"
  [data]="core axes"
  [data/text]="core"
  [models]="core"
  [train/checkpoint]="core models results runtime"
  [train/optim]="core runtime"
  [train/parallel]="core axes models profile runtime"
  [train/recipes]="core axes data data/text models profile results runtime session train train/checkpoint train/optim train/parallel"
  [train]="core axes data data/text models profile results runtime session train/checkpoint train/optim train/parallel"
)
for folder in "${!below[@]}"; do
  allowed=" $folder ${below[$folder]} "
  while IFS=: read -r file line include; do
    dir=$(dirname "$include")
    [[ "$allowed" == *" $dir "* ]] && continue
    echo "$file:$line: includes $include: $folder may include only ${below[$folder]:-itself}"
    status=1
  done < <(grep -n '^#include "[a-z_]*/' modules/"$folder"/*.{h,cpp} 2>/dev/null | sed 's/#include "\([^"]*\)".*/\1/')
done
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
mapfile -t train_files < <(git ls-files 'modules/train/*.cpp' 'modules/train/*.h')
if ! "$PY" -m lizard -l cpp -L 100000 -C 100000 -a "$MAX_TRAIN_PARAMETERS" -w "${train_files[@]}"; then
  echo "(functions of modules/train with over $MAX_TRAIN_PARAMETERS parameters above)"
  status=1
fi
((status == 0)) && echo "shape: ${#files[@]} files of modules/ and app/, none over $MAX_FILE_LINES lines, no function over $MAX_FUNCTION_LINES, none of modules/train over $MAX_TRAIN_PARAMETERS parameters"
exit $status
