#!/usr/bin/env bash
# Submits the papers' experiment matrices, one SLURM job per point (not a job array: the points need
# different numbers of GPUs, and a job array shares one resource request). Every point writes
# <outputs>/<job id>/results.h5; the whole matrix is analysed with one command:
#   mgbench report '<outputs>/*/results.h5'          (add --csv for a spreadsheet)
#
#   slurm/matrix.sh image [--dry-run] [--test-only] [--cpu] [--local] [-- extra mgbench image options]
#   slurm/matrix.sh llm   [--dry-run] [--test-only] [--cpu] [--local] -- --model DIR [extra mgbench llm options]
#
# image (Lawenda et al. 2025, Figs. 1-6, Table 2): GPUS x STRATEGIES x PRECISIONS x PIN x SIZES
# llm   (Lawenda et al. 2025, sec. 4, Table 5):    GPUS x DATASETS x PIN
# Each axis is an environment variable (space-separated), defaults below. Also:
#   OUTPUTS        results root of this matrix (default outputs/matrix-<task>-<UTC time>, below the
#                  directory it is run from: the jobs are submitted from there)
#   MNIST          --data of the image points (default $HOME/mnist)
#   DATA_DIR       directory of the LLM datasets: <DATA_DIR>/<dataset>.jsonl (or .json, .csv, .tsv)
#   SBATCH_ARGS    extra sbatch options (account, partition, QoS, time)
#   MGBENCH        the binary (default: the module's, else build/app/mgbench; --local too)
# --cpu: CPU variants (no GPUs requested, --device cpu), for workstations and the CI's test SLURM.
# --dry-run: print the sbatch commands only. --test-only: sbatch --test-only (validates, runs nothing).
# --local: no SLURM: run the points one after another here with mpirun (a workstation; with --cpu and
#   small settings after --, a miniature of the papers' matrix), then: mgbench-plot OUTPUTS --out DIR.
set -euo pipefail
# Where the scripts are (the checkout, or the module's $MGBENCH_SHARE); the outputs go below the
# directory it is run from (an installed tree may be read-only), where the jobs are submitted from.
root=$(cd "$(dirname "$0")/.." && pwd)

task=${1:-}
[[ "$task" == image || "$task" == llm ]] || { sed -n '2,23p' "$0" >&2; exit 2; }
shift
dry_run=0 test_only=() cpu=0 local=0 failed=0 extra=()
while (($#)); do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --test-only) test_only=(--test-only) ;;
    --cpu) cpu=1 ;;
    --local) local=1 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "slurm/matrix.sh: unknown argument '$1' (see the header of slurm/matrix.sh)" >&2; exit 2 ;;
  esac
  shift
done

# The binary, found as the jobs' is (a checkout's build/app/mgbench by its path), and passed on to
# them with the scripts' directory: sbatch exports the environment, so jobs submitted from any
# directory find both.
source "$root/slurm/common.sh"
local_binary=$(mgbench_binary)
[[ "$local_binary" == /* ]] || local_binary="$root/$local_binary"
export MGBENCH=$local_binary MGBENCH_SHARE=${MGBENCH_SHARE:-$root}
GPUS=${GPUS:-"1 2 3 4"}
OUTPUTS=${OUTPUTS:-outputs/matrix-$task-$(date -u +%Y%m%dT%H%M%SZ)}
read -r -a sbatch_args <<<"${SBATCH_ARGS:-}"
device=()
((cpu)) && device=(--device cpu)

((local)) && ((${#test_only[@]})) && { echo "slurm/matrix.sh: --local runs without SLURM: --test-only does not apply" >&2; exit 2; }
# The LLM points fine-tune llama3-8b from its checkpoint by default, which only --model names: say so
# before submitting a matrix of jobs that would each fail at set-up.
if [[ "$task" == llm ]]; then
  model_given=0
  for arg in "${extra[@]}"; do
    [[ "$arg" =~ ^--(model|config|init)(=.*)?$ ]] && model_given=1
  done
  ((model_given)) || { echo "slurm/matrix.sh llm: name the model after --: -- --model DIR (a Hugging Face checkpoint folder, e.g. Meta-Llama-3-8B-Instruct), or -- --init random for the preset's shape without weights" >&2; exit 2; }
fi

run_here() {  # run_here RANKS NAME SCRIPT ARGS...: the point with mpirun, results in OUTPUTS/NAME/results.h5
  local ranks=$1 name=$2 task_of_script
  task_of_script=$(basename "$3" .sbatch)
  shift 3
  local dir="$OUTPUTS/$name" outputs=()
  [[ "$task_of_script" == llm ]] && outputs=(--output-dir "$dir/adapter")
  for arg in "$@" "${extra[@]}"; do [[ $arg == --eval-only ]] && outputs=(); done  # an evaluation writes nothing (as llm.sbatch)
  local cmd=(mpirun -np "$ranks" --oversubscribe --bind-to none "$local_binary" "$task_of_script" "$@" "${device[@]}"
    "${extra[@]}" --results "$dir/results.h5" "${outputs[@]}")
  if ((dry_run)); then
    printf '%q ' "${cmd[@]}"
    echo
  else
    mkdir -p "$dir"
    echo "# $name" >&2
    "${cmd[@]}" >"$dir/log.txt" 2>&1 || { echo "slurm/matrix.sh: $name failed: see $dir/log.txt" >&2; failed=$((failed + 1)); }
  fi
}

submit() {  # submit RANKS NAME SCRIPT ARGS...
  local ranks=$1 name=$2 script=$3
  if ((local)); then
    run_here "$@"
    return
  fi
  shift 3
  local resources=(--ntasks-per-node="$ranks")
  if ((cpu)); then
    resources+=(--gpus-per-node=0 --cpus-per-task=1)
  else
    resources+=(--gpus-per-node="$ranks")
  fi
  local cmd=(sbatch "${test_only[@]}" --parsable --job-name="$name" "${resources[@]}" "${sbatch_args[@]}"
    --output="$OUTPUTS/%x-%j.out" "$script" "$@" "${device[@]}" "${extra[@]}")
  if ((dry_run)); then
    printf '%q ' env MGBENCH_OUTPUTS="$OUTPUTS" "${cmd[@]}"
    echo
  else
    MGBENCH_OUTPUTS="$OUTPUTS" "${cmd[@]}"
  fi
}

((dry_run)) || mkdir -p "$OUTPUTS"
n=0
if [[ "$task" == image ]]; then
  MNIST=${MNIST:-$HOME/mnist}
  ((dry_run)) || [[ -d "$MNIST" ]] || { echo "slurm/matrix.sh: MNIST directory '$MNIST' does not exist (set MNIST)" >&2; exit 2; }
  for gpus in $GPUS; do
    for strategy in ${STRATEGIES:-ddp ddp-rr ddp-ds}; do
      for precision in ${PRECISIONS:-fp64 fp32 fp16}; do
        for pin in ${PIN:-false true}; do
          for size in ${SIZES:-100 300 500 700}; do
            name="img-${gpus}g-$strategy-$precision-pin$pin-${size}px"
            submit "$gpus" "$name" "$root/slurm/image.sbatch" --config "$root/inputs/configs/paper-table2.ini" --data "$MNIST" \
              --strategy "$strategy" --precision "$precision" --pin-memory "$pin" --image-size "$size" \
              --run-name "$name"
            n=$((n + 1))
          done
        done
      done
    done
  done
else
  DATA_DIR=${DATA_DIR:-$HOME/data}
  for gpus in $GPUS; do
    for dataset in ${DATASETS:-alpaca grammar samsum slimorca}; do
      for pin in ${PIN:-false true}; do
        data=""
        for ext in jsonl json csv tsv; do
          [[ -e "$DATA_DIR/$dataset.$ext" ]] && { data="$DATA_DIR/$dataset.$ext"; break; }
        done
        if [[ -z "$data" ]]; then
          ((dry_run)) || { echo "slurm/matrix.sh: no $DATA_DIR/$dataset.{jsonl,json,csv,tsv} (set DATA_DIR)" >&2; exit 2; }
          data="$DATA_DIR/$dataset.jsonl"
        fi
        name="llm-${gpus}g-$dataset-pin$pin"
        submit "$gpus" "$name" "$root/slurm/llm.sbatch" --dataset "$dataset" --data "$data" --pin-memory "$pin" --run-name "$name"
        n=$((n + 1))
      done
    done
  done
fi
if ((local)); then
  echo "# $n point(s) run here into $OUTPUTS ($failed failed): mgbench report --plot $OUTPUTS/figures '$OUTPUTS/*/results.h5'" >&2
  ((failed == 0))
else
  echo "# $n job(s) for $OUTPUTS; when done: mgbench report '$OUTPUTS/*/results.h5'" >&2
fi
