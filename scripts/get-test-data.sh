#!/usr/bin/env bash
# Finds or fetches the test suite's inputs (MNIST, the tokenizers, the text sets, a tiny Llama) and
# prints their directory as the last line of stdout: scripts/get_test_data.py (its header says where
# it looks and what it fetches) under the venv's Python, with pyarrow from TorchTune's folder beside
# the venv (SAMSum's upstream is in Arrow files).
#   scripts/get-test-data.sh           -> e.g. /work/shared/data or ~/.cache/mgbench/data/test-inputs
#   scripts/get-test-data.sh --list    -> each input's path, upstream and licence
set -euo pipefail
cd "$(dirname "$0")/.."
MGBENCH_VENV=${MGBENCH_VENV:-$HOME/.cache/mgbench/venv}
[[ -x "$MGBENCH_VENV/bin/python" ]] || { echo "get-test-data: no venv at $MGBENCH_VENV: run scripts/install-deps.sh" >&2; exit 1; }
PYTHONPATH="$MGBENCH_VENV/torchtune-site${PYTHONPATH:+:$PYTHONPATH}" exec "$MGBENCH_VENV/bin/python" scripts/get_test_data.py "$@"
