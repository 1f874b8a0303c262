#!/usr/bin/env bash
# scripts/gpu-check.sh on a lent GPU machine whose runner brings back only a few files of $OUT (this
# workplace's device tool: at most 8 files, 16 MiB each, two folders deep; one command of at most
# 2,000 characters; a call stopped at its limit). gpu-check.sh writes its logs, results files,
# TorchTune's dataset cache and figures into a scratch folder instead, within LEASE_TIMEOUT_S
# (its whole process group stopped there, so that what it wrote still comes back before the call's
# own limit), and then $OUT receives three files:
#   summary.txt    everything gpu-check.sh printed
#   results.tgz    the results files it wrote at its top level (*.h5, *.jsonl, *.csv): to be unpacked
#                  into benchmarks/results/<date>-<gpu>/ and committed
#   logs.tgz       the rest (run logs, ctest logs, reports), without the dataset cache and the figures
#                  (`mgbench report --plot` draws them again from the results files)
# Exit status: gpu-check.sh's; 124 where LEASE_TIMEOUT_S stopped it.
#   LEASE_TIMEOUT_S=400 SKIP_TESTS=1 BENCH_SETS=torchtune scripts/gpu-lease.sh
# Environment: OUT (the folder that comes back; required), LEASE_TIMEOUT_S (400 s), LEASE_SCRATCH
# (/tmp/gpu-lease-<pid>), GPU_CHECK (scripts/gpu-check.sh; a test puts a stand-in there); every other
# variable is gpu-check.sh's.
set -uo pipefail
cd "$(dirname "$0")/.."
BACK=${OUT:?OUT: the folder whose files come back}
LEASE_TIMEOUT_S=${LEASE_TIMEOUT_S:-400}
[[ $LEASE_TIMEOUT_S =~ ^[1-9][0-9]*$ ]] || { echo "gpu-lease.sh: LEASE_TIMEOUT_S '$LEASE_TIMEOUT_S': expected whole seconds >= 1" >&2; exit 2; }
SCRATCH=${LEASE_SCRATCH:-/tmp/gpu-lease-$$}
mkdir -p "$SCRATCH" "$BACK" || exit 2
SCRATCH=$(realpath "$SCRATCH")

# gpu-check.sh in a session of its own: at the limit the whole group (mpirun, the ranks, the peers)
# is stopped, not gpu-check.sh alone.
OUT=$SCRATCH setsid "${GPU_CHECK:-scripts/gpu-check.sh}" &
check=$!
(
  for ((waited = 0; waited < LEASE_TIMEOUT_S; ++waited)); do sleep 1; done  # stopped with at most a second's sleep left
  echo "gpu-lease.sh: LEASE_TIMEOUT_S=$LEASE_TIMEOUT_S s reached: stopping gpu-check.sh and its runs"
  : >"$SCRATCH/.lease-timed-out"
  kill -TERM -- "-$check" 2>/dev/null
  sleep 10
  kill -KILL -- "-$check" 2>/dev/null
) &
watcher=$!
wait "$check"
rc=$?
kill "$watcher" 2>/dev/null
wait "$watcher" 2>/dev/null
if [[ -f $SCRATCH/.lease-timed-out ]]; then
  rc=124
  kill -KILL -- "-$check" 2>/dev/null  # what the watcher, stopped above, may not have reached
  rm -f "$SCRATCH/.lease-timed-out"
fi
echo "gpu-lease.sh: gpu-check.sh exit $rc$( ((rc == 124)) && echo " (stopped at LEASE_TIMEOUT_S)")"

[[ -f $SCRATCH/summary.txt ]] && cp "$SCRATCH/summary.txt" "$BACK/"
(
  cd "$SCRATCH" || exit 1
  find . -maxdepth 1 -type f \( -name '*.h5' -o -name '*.jsonl' -o -name '*.csv' \) -print0 | sort -z |
    tar czf "$BACK/results.tgz" --null -T -
  tar czf "$BACK/logs.tgz" --exclude=./hf-datasets --exclude=./figures --exclude='./*.h5' --exclude='./*.jsonl' \
    --exclude='./*.csv' --exclude=./summary.txt .
)
for f in "$BACK"/summary.txt "$BACK"/results.tgz "$BACK"/logs.tgz; do
  [[ -f $f ]] || continue
  size=$(stat -c %s "$f")
  ((size <= 16 * 1024 * 1024)) || echo "gpu-lease.sh: $f is $size bytes, over the 16 MiB a file that comes back may have"
done
ls -l "$BACK"
exit "$rc"
