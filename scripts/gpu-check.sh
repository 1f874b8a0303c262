#!/usr/bin/env bash
# One command for an H100/H200 machine: build mgbench against the PyTorch that machine has
# (python3 with torch 2.11.0+cu130), run the unit, mpi, GPU and CPU end-to-end tests and a
# preemption (SIGUSR1, exit 75, --resume) on the GPU, then the benchmark tables (mgbench vs the
# Python torch peer; HtoD bytes per sample with device vs host upscaling; the checkpoint cost; LLM
# recipes: LoRA, DPO, QLoRA on llama3-8b shapes, every recipe vs LoRA on llama3.2-1b; `mgbench comm`
# over NCCL, with nccl-tests beside it where NCCL_TESTS names a build; `mgbench predict` from them).
# Aims at under ten minutes on 16 cores for the tests and each set of tables (BENCH_SETS).
#
# The papers' settings (issue 49; Lawenda et al. 2025, arXiv 2503.15252), sets of their own, none in the
# default BENCH_SETS, each sized for one 8-minute call on an H100 after the build (SET_BUDGET_S, below):
#   table2        Table 2: MobileNetV2, one GPU, inputs/configs/paper-table2.ini (500 px, batch 64: the
#                 paper states neither), fp64, fp32 (TF32 off), tf32 (on), fp16, amp-bf16; a few short timed
#                 epochs, and the 20 epochs of 60,000 images projected from them (labelled as such)
#   fig2          Fig. 2: fp64 at 100, 200, 300, 400, 500 px
#   table3        Table 3: fp32, host-side upscaling (--upscale host, the paper's pipeline), pin_memory false vs true
#   cuda-metrics  Figs. 3 and 5: CUPTI's API and kernel shares (cudaLaunchKernel, HtoD memcpy,
#                 cudaStreamSynchronize, NCCL kernels) at 100 and 500 px, pin_memory false / true; LoRA fp32 (Fig. 5)
#   techniques    full, lora, qlora, qat, dpo on llama3.2-3b, then llama3-8b: s/it, peak VRAM, HtoD bytes per step,
#                 J/token; `mgbench predict --ranks 1,2` of them: the inter-GPU bytes per step at 2 ranks
#   graphs        issue 47: --cuda-graphs off vs on, MobileNetV2 at 100, 224 and 500 px, amp-bf16 and fp32
#                 (and DDP over the GPUs at 224 px where there are two or more: GRAPHS_DDP_NP);
#                 LoRA bf16 on llama3.2-1b and llama3-8b shapes, padded and packed, to multiples of 64 tokens
#   torchtune     issue 47 item 1: mgbench beside TorchTune 0.6.1's own single-device recipes on the same GPU, shape,
#                 rows, batch and precision (bench/peer_torchtune.py): LoRA on llama3-8b bf16 padded and packed,
#                 TorchTune eager and compiled, the paper's fp32 padded, CUPTI's cost, DPO and full on llama3.2-1b;
#                 $OUT/llm_peers.csv and the table (bench/llm_peers.py). PEERS_RUNS picks runs (default all)
# Their results files are $OUT/<set>.h5 (`mgbench report [--cuda] FILE` prints them again; the
# figures stage draws them).
#   DRY_RUN=1 BENCH_SETS="table2 fig2 table3 cuda-metrics techniques graphs" scripts/gpu-check.sh
# prints those sets' command lines ("+ ..."), runs nothing, and needs no GPU, .gpu-deps or build
# (tests/python/test_gpu_check_sets.py checks each line with `mgbench ... --dry-run`).
#
#   scripts/fetch-gpu-deps.sh            # beforehand, on a Debian 12 machine with network
#   scripts/gpu-check.sh                 # on the GPU machine, in the checkout (.gpu-deps/ beside it;
#                                        # with this workplace's device tool: carry [".gpu-deps"],
#                                        # through scripts/gpu-lease.sh: three files come back)
#
# Data: MNIST (tests, image benchmarks), the Llama 3 tokenizer and the text samples (LLM stage):
# ../shared/data does not travel to a lent machine; copy it to shared/data inside the checkout
# (git-ignored there, ~12 MB) or set DATA to the MNIST folder of a data/ tree holding llama3/ and text/.
#
# Brought along in .gpu-deps/ (Debian 12 .debs, unpacked into $PREFIX, never into /): Open MPI
# 4.1.4 (+ PMIx, hwloc, libevent, libfabric, UCX, verbs), parallel HDF5 1.10.8, Boost 1.74
# (program_options), spdlog 1.10 / fmt 9, nlohmann-json 3.11, GoogleTest 1.12, Google Benchmark
# 1.7, zlib headers; wheels: torchvision and Pillow (unpacked where the machine lacks them: this workplace's
# image has both, so fetch-gpu-deps.sh's GPU_HAS leaves them out), nvJPEG, and in wheels/torchtune-site TorchTune
# 0.6.1 with what its recipes import (the torchtune set's peer only). Used from the machine: python3 with torch (LibTorch, and NCCL / CUPTI from its
# nvidia-* packages), torchvision, h5py, pytest; the CUDA toolkit (nvcc 13.0); g++, cmake, ninja.
#
# Output: everything printed is also written to $OUT/summary.txt (one file to bring back); logs
# and results files beside it.
# Environment: DEPS (.gpu-deps), PREFIX (/tmp/mgbench-deps), BUILD (build-gpu), OUT (logs and
# tables; default $BUILD/out), DATA (MNIST dir; default shared/data/mnist or ../shared/data/mnist),
# GPU_TEST_TIMEOUT (600 s per GPU test; a test alive at 2/3 of it has its threads printed by eu-stack),
# BENCH_SIZES ("224 500"), BENCH_PRECISIONS ("fp32 fp16 amp-bf16"), BENCH_TRAIN (4096 images),
# SKIP_TESTS / SKIP_BENCH (1 to skip), CPU_TESTS (0: the gpu tests and the preemption only), GPU_TESTS (0:
# the preemption without the gpu tests), BUILD_TARGETS (e.g. "mgbench mgbench-report mgbench_gpu_tests" for a
# short lease; default all), BENCH_SETS ("image images io comm llm fsdp recipes": which benchmark tables;
# one or two sets a call where a call is limited to 10 minutes), BENCH_WARMUP (10: steps left out of the image tables' img/s),
# QUICK (1: the image tables without the +malloc peer and the CUPTI run), NATIVE_SIZES ("300 500"),
# NATIVE_MODELS ("mobilenet_v2 resnet50"), NATIVE_WORKERS (8: loader threads = DataLoader workers),
# NATIVE_DECODES ("host hardware gpu-hybrid hybrid": --decode host, or device with that --nvjpeg-backend),
# NATIVE_EPOCHS (1: the decode runs' epochs of BENCH_TRAIN images),
# NATIVE_PEER_MODELS (the models of NATIVE_MODELS also timed against the Python peer, and with any,
# the loader-alone table; default all, "none": only the decode runs), GPU_TEST_FILTER (a ctest -R
# regex among the gpu tests), PREEMPTION (0: no preemption stage),
# CONFIGURE_ONLY (1: stop after cmake, for checking the script),
# FORCE_DEPS (1: use .gpu-deps even where MPI and HDF5 are installed),
# DRY_RUN (1: the paper sets' command lines only, above), SET_BUDGET_S (300: seconds a paper set may start
# runs in; what is left is printed as skipped; SET_GRACE_S (45) more before a run is stopped),
# TABLE2_PRECISIONS ("fp16 fp64 fp32 tf32 amp-bf16"), TABLE2_TRAIN (2048 images an epoch), TABLE2_EPOCHS (3),
# FIG2_SIZES ("100 200 300 400 500"), PAPER_TRAIN (2048 images: fig2, table3, cuda-metrics), CUDA_METRICS_NP
# (the visible GPUs, at most 4: the paper's Fig. 3 had 2 and 4), TECHNIQUES_MODELS ("llama3.2-3b llama3-8b"),
# TECHNIQUES_RECIPES ("full lora qlora qat dpo"), TECHNIQUES_STEPS (10), GRAPHS_SIZES ("100 224 500"; "": no image rows),
# GRAPHS_PRECISIONS ("amp-bf16 fp32"), GRAPHS_LLM_MODELS ("llama3.2-1b llama3-8b"), GRAPHS_LLM_PADDINGS ("pad none").
set -euo pipefail
# SIGUSR1 / SIGTERM blocked or ignored by whatever started this script stay so in mpirun (the mask
# and ignored signals survive exec), which then never forwards the preemption notice (the second
# H200 reading: mpirun printed no "Forwarding signal"). Start over with both at their defaults.
if [[ -z ${MGBENCH_STOP_SIGNALS_RESET:-} ]] && command -v python3 >/dev/null; then
  export MGBENCH_STOP_SIGNALS_RESET=1
  exec python3 -c 'import os, signal, sys
stops = {signal.SIGUSR1, signal.SIGTERM}
signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
for s in stops: signal.signal(s, signal.SIG_DFL)
os.execv(sys.argv[1], sys.argv[1:])' "$0" "$@"
fi
cd "$(dirname "$0")/.."
DEPS=${DEPS:-.gpu-deps}
PREFIX=${PREFIX:-/tmp/mgbench-deps}
TORCHTUNE_SITE=${TORCHTUNE_SITE:-$PREFIX/torchtune-site}  # TorchTune for the torchtune set's peer (below)
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-$BUILD/out}
if [[ -z ${DATA:-} ]]; then
  for d in shared/data/mnist ../shared/data/mnist; do [[ -d $d ]] && DATA=$(realpath "$d") && break; done
fi
DRY_RUN=${DRY_RUN:-0}
# A dry run only prints command lines, on any machine: a path that may not exist there will do.
[[ $DRY_RUN == 1 ]] && DATA=${DATA:-shared/data/mnist}
DATA=${DATA:?no MNIST directory: set DATA}
T0=$(date +%s)
stage() { echo "== [$(($(date +%s) - T0)) s] $*"; }
fail() { echo "gpu-check.sh: $*" >&2; exit 1; }
# Everything this script prints (machine, versions, test results, tables) also goes to one file:
# the evidence a short lease on a GPU machine brings back. A dry run writes nothing.
SUMMARY=$OUT/summary.txt
if [[ $DRY_RUN != 1 ]]; then
  mkdir -p "$OUT"
  : >"$SUMMARY"
  exec > >(tee -a "$SUMMARY") 2>&1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

if [[ $DRY_RUN == 1 ]]; then
  stage "dry run: the command lines of the sets in BENCH_SETS that have them; nothing runs"
  PYTHON=python3
  visible_gpus() { echo 1; }  # rank counts as on a machine with one GPU
else
# The machine, the dependencies, the build and the tests, down to the benchmark sets. Not indented
# under this else: their heredocs and python -c bodies must keep their lines in column 0.
stage "machine"
echo "date $(date -u +%FT%TZ), host $(hostname), $(nproc) cores, commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)"
nvidia-smi 2>/dev/null | head -20 || true
nvcc --version 2>/dev/null | tail -2 || true
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader ||
  [[ ${CONFIGURE_ONLY:-0} == 1 || ${NO_GPU_OK:-0} == 1 ]] || fail "nvidia-smi: no GPU (NO_GPU_OK=1 to build and test anyway)"
PYTHON=$(command -v python3)
# The GPUs the CUDA runtime enumerates -- what mgbench's ranks see: CUDA_VISIBLE_DEVICES and MIG
# instances included (`nvidia-smi -L | wc -l` counts MIG lines and ignores CUDA_VISIBLE_DEVICES);
# 0 without a runtime or a device.
visible_gpus() {
  "$PYTHON" - 2>/dev/null <<'PY' || echo 0
import ctypes, ctypes.util, glob
runtime = None
for path in sorted(glob.glob("/usr/local/cuda/lib64/libcudart.so*")) + [ctypes.util.find_library("cudart") or ""]:
    try:
        runtime = ctypes.CDLL(path)
        break
    except OSError:
        continue
count = ctypes.c_int(0)
print(count.value if runtime is not None and runtime.cudaGetDeviceCount(ctypes.byref(count)) == 0 else 0)
PY
}
echo "CUDA runtime: $(visible_gpus) visible device(s) (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset})"
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
# The Python peers need torchvision (and Pillow): from .gpu-deps/wheels where the machine lacks them.
for module in torchvision PIL; do
  "$PYTHON" -c "import $module" 2>/dev/null && continue
  wheel=$(compgen -G "$DEPS/wheels/$([[ $module == PIL ]] && echo pillow || echo "$module")-*.whl" | head -1 || true)
  [[ -n $wheel ]] || { echo "python: no $module and no wheel for it in $DEPS/wheels (the peers will fail)"; continue; }
  # A wheel is a zip: unpacked onto PYTHONPATH it imports (the machine's venv may have no pip).
  "$PYTHON" -m zipfile -e "$wheel" "$PREFIX/python" && echo "python: $module from $wheel"
  export PYTHONPATH=$PREFIX/python${PYTHONPATH:+:$PYTHONPATH}
done
# TorchTune 0.6.1 and what its recipes import (the `torchtune` set's peer), unpacked into a folder of its own
# that only the peer's runs put on PYTHONPATH: its torchao 0.11 is older than what peft on the machine wants.
if [[ -d $DEPS/wheels/torchtune-site && ! -d $TORCHTUNE_SITE/torchtune ]]; then
  for wheel in "$DEPS"/wheels/torchtune-site/*.whl; do "$PYTHON" -m zipfile -e "$wheel" "$TORCHTUNE_SITE"; done
  for sdist in "$DEPS"/wheels/torchtune-site/antlr4-python3-runtime-*.tar.gz; do  # pure Python, src/antlr4
    [[ -f $sdist ]] && tar -xzf "$sdist" -C "$TORCHTUNE_SITE" --strip-components=2 --wildcards '*/src/antlr4'
  done
  echo "python: TorchTune for the torchtune set's peer in $TORCHTUNE_SITE"
fi
"$PYTHON" - <<'PY'
import importlib
found = []
for name in ("torchvision", "PIL", "numpy", "h5py", "pandas", "matplotlib", "pytest", "transformers"):
    try:
        found.append(f"{name} {getattr(importlib.import_module(name), '__version__', '?')}")
    except Exception as e:  # noqa: BLE001 -- any failure to import is what this line reports
        found.append(f"{name} missing ({type(e).__name__})")
print("python:", ", ".join(found))
PY
env | grep -E "^(OMPI|PMIX|OPAL|UCX|NCCL)_" | sort | sed 's/^/machine env: /' || true

# nvJPEG (--decode device): the CUDA toolkit's, or torch's nvidia/cu13, else the wheel in .gpu-deps/wheels.
NVJPEG_ROOT=""
if ! compgen -G "/usr/local/cuda/include/nvjpeg.h" >/dev/null &&
  ! "$PYTHON" -c 'import os, nvidia; raise SystemExit(not any(os.path.exists(os.path.join(p, "cu13/include/nvjpeg.h")) for p in nvidia.__path__))' 2>/dev/null; then
  wheel=$(compgen -G "$DEPS/wheels/nvidia_nvjpeg-*.whl" | head -1 || true)
  if [[ -n $wheel ]]; then
    "$PYTHON" -m zipfile -e "$wheel" "$PREFIX/nvjpeg" && NVJPEG_ROOT=$PREFIX/nvjpeg/nvidia/cu13
    ln -sf libnvjpeg.so.13 "$NVJPEG_ROOT/lib/libnvjpeg.so"
    echo "nvJPEG: from $wheel"
  else
    echo "nvJPEG: none (--decode device unavailable)"
  fi
fi

# The tests' data: ctest sets MGBENCH_SHARED_DATA from the configure-time value, over the environment.
CMAKE_ARGS=(-G Ninja -DCMAKE_BUILD_TYPE=Release "-DMGBENCH_PYTHON=$PYTHON" "-DMGBENCH_SHARED_DATA=$(dirname "$DATA")"
  "-DMGBENCH_GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-600}" ${NVJPEG_ROOT:+"-DMGBENCH_NVJPEG_ROOT=$NVJPEG_ROOT"})
if [[ ${FORCE_DEPS:-0} == 1 ]] || ! command -v mpirun >/dev/null || ! ls /usr/include/hdf5/openmpi/hdf5.h >/dev/null 2>&1; then
  stage "unpack $DEPS into $PREFIX"
  [[ -d $DEPS ]] || fail "$DEPS/ not found: run scripts/fetch-gpu-deps.sh on a Debian 12 machine and carry it here"
  mkdir -p "$PREFIX"
  for f in "$DEPS"/*.deb; do dpkg-deb -x "$f" "$PREFIX"; done
  U=$PREFIX/usr
  L=$U/lib/x86_64-linux-gnu
  # libcurl (under HDF5) and its needs: the machine's own copy of each library wins; ours fills in
  # only the sonames the machine lacks, so no Debian copy shadows the image's TLS stack.
  LDCONFIG=$(command -v ldconfig || echo /sbin/ldconfig)
  for f in "$DEPS"/system-first/*.deb; do [[ -f $f ]] && dpkg-deb -x "$f" "$PREFIX/system-first"; done
  for lib in "$PREFIX"/system-first/usr/lib/x86_64-linux-gnu/*.so.*; do
    [[ -f $lib && ! -L $lib ]] || continue
    soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    if [[ -n $soname ]] && ! "$LDCONFIG" -p | awk -v s="$soname" '$1 == s {found = 1} END {exit !found}'; then
      cp "$lib" "$L/$soname" && echo "from $DEPS/system-first: $soname (the machine has none)"
    fi
  done
  ln -sf mpirun.openmpi "$U/bin/mpirun"
  export OPAL_PREFIX=$U PATH=$U/bin:$PATH
  export LD_LIBRARY_PATH=$L/openmpi/lib:$L/hdf5/openmpi:$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  libz=$("$(command -v ldconfig || echo /sbin/ldconfig)" -p | awk '$1 == "libz.so.1" {print $NF; exit}')
  CMAKE_ARGS+=("-DCMAKE_PREFIX_PATH=$U" -DMPI_SKIP_COMPILER_WRAPPER=ON -DMPI_CXX_SKIP_MPICXX=ON
    "-DMPI_C_HEADER_DIR=$L/openmpi/include" "-DMPI_CXX_HEADER_DIR=$L/openmpi/include"
    -DMPI_C_LIB_NAMES=mpi -DMPI_CXX_LIB_NAMES=mpi "-DMPI_mpi_LIBRARY=$L/openmpi/lib/libmpi.so"
    "-DMPIEXEC_EXECUTABLE=$U/bin/mpirun"
    "-DMGBENCH_HDF5_INCLUDE_DIR=$U/include/hdf5/openmpi" "-DMGBENCH_HDF5_LIBRARY=$L/hdf5/openmpi/libhdf5.so"
    "-DZLIB_INCLUDE_DIR=$U/include" "-DZLIB_LIBRARY=$libz")
  mpirun -np 2 true || fail "the unpacked Open MPI does not start (see above)"
fi

# eu-stack for the hang detector below, where .gpu-deps/tools has it and the machine lacks one.
EU_STACK=$(command -v eu-stack || true)
if [[ -z $EU_STACK ]] && compgen -G "$DEPS/tools/*.deb" >/dev/null; then
  mkdir -p "$PREFIX/tools"
  for f in "$DEPS"/tools/*.deb; do dpkg-deb -x "$f" "$PREFIX/tools"; done
  EU_STACK="env LD_LIBRARY_PATH=$PREFIX/tools/usr/lib/x86_64-linux-gnu $PREFIX/tools/usr/bin/eu-stack"
fi
# Writes the threads of every process named $1 alive longer than $2 s to $OUT/stack-PID.txt, then
# kills it (its mpirun then ends the job: no orphan rank holds the GPU for the tests after it). A
# test that hangs is read, not guessed at. Runs until killed.
watch_for_hangs() {
  [[ -n $EU_STACK ]] || return 0
  while sleep 5; do
    for pid in $(pgrep -x "${1:0:15}"); do
      age=$(ps -o etimes= -p "$pid" 2>/dev/null | tr -d ' ') || continue
      if [[ -n $age ]] && ((age > $2)) && [[ ! -e $OUT/stack-$pid.txt ]]; then
        $EU_STACK -i -p "$pid" >"$OUT/stack-$pid.txt" 2>&1 || true
        kill -9 "$pid" 2>/dev/null || true
        echo "gpu-check.sh: $1 (pid $pid) still running after ${age} s: killed, threads in $OUT/stack-$pid.txt"
      fi
    done
  done
}

stage "configure ($BUILD)"
cmake -S . -B "$BUILD" "${CMAKE_ARGS[@]}" >"$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log"; fail "configure failed"; }
grep -E "mgbench: (CUDA|NCCL|CUPTI)" "$OUT/configure.log" || true
[[ ${CONFIGURE_ONLY:-0} == 1 ]] && exit 0
stage "build"
cmake --build "$BUILD" -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} >"$OUT/build.log" 2>&1 || { grep -E "error|Error" "$OUT/build.log" | head -40; fail "build failed"; }
ldd "$BUILD/app/mgbench" | grep -E "not found|libnccl|libcupti|libmpi.so|libhdf5" || true
# libstdc++ must come before LibTorch (whose libtorch.so exports a std::filesystem of its own).
readelf -d "$BUILD/app/mgbench" | grep -m 3 NEEDED || true
"$BUILD/app/mgbench" --version
mpirun --version 2>/dev/null | head -1 || true

if [[ ${SKIP_TESTS:-0} != 1 ]]; then
  export MGBENCH_SHARED_DATA=$(dirname "$DATA")
  # The GPU tests first: they are what only this machine can run (the rest also runs on CPUs, in CI).
  if [[ ${GPU_TESTS:-1} == 1 ]]; then
    stage "tests: gpu"
    watch_for_hangs mgbench_gpu_tests "$(((${GPU_TEST_TIMEOUT:-600} * 2) / 3))" &
    watcher=$!
    (cd "$BUILD" && ctest -L gpu ${GPU_TEST_FILTER:+-R "$GPU_TEST_FILTER"} -V >"$OUT/ctest-gpu.log" 2>&1) || true
    kill "$watcher" 2>/dev/null || true
    for f in "$OUT"/stack-*.txt; do [[ -f $f ]] && { echo "== $f"; grep -E "^TID|^#[0-9]+ " "$f" | head -150; }; done
    grep -E "tests passed|FAILED|\(Failed\)|\(Skipped\)|Not Run" "$OUT/ctest-gpu.log" || true
    grep -E "^\S+: \[ +(OK|FAILED|SKIPPED) +\]|Failure|Expected|Which is|Skipped|make_oracles" "$OUT/ctest-gpu.log" | head -60 || true
  fi

  if [[ ${PREEMPTION:-1} == 1 ]]; then
    stage "preemption on the GPU: SIGUSR1 after the first checkpoint, exit 75, then --resume (64 px, amp-bf16)"
    # 10 epochs (640 steps, ~15 s after the first): long enough to see which signal path stops it.
    PREEMPT=(image --data "$DATA" --image-size 64 --batch-size 64 --limit-train 4096 --limit-test 256 --epochs 10
      --precision amp-bf16 --pin-memory true --cudnn-benchmark false --checkpoint-dir "$OUT/preempt-ck" --checkpoint-every 8
      --results "$OUT/preempt.h5" --progress-interval 1000)
    rm -rf "$OUT/preempt-ck" "$OUT/preempt.h5" "$OUT/preempt.h5.lock"
    mpirun -np 1 --bind-to none "$BUILD/app/mgbench" "${PREEMPT[@]}" >"$OUT/preempt-1.log" 2>&1 &
    pid=$!
    for _ in $(seq 1200); do
      compgen -G "$OUT/preempt-ck/*/step-?????????" >/dev/null && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    # Whether each rank catches SIGUSR1 when it is sent (SigCgt bit 9, 0x200): a library that
    # replaced mgbench's handler would show here (the first H200 reading ran on through the signal).
    for rank_pid in "$pid" $(pgrep -P "$pid"); do
      echo "rank pid $rank_pid ($(cat /proc/"$rank_pid"/comm 2>/dev/null)): $(grep -E "^Sig(Cgt|Blk|Ign)" /proc/"$rank_pid"/status 2>/dev/null | tr '\n\t' '  ')"
    done
    # Open MPI forwards SIGUSR1 to its ranks (ess_base_forward_signals); the second H200 reading saw
    # the rank run on. Which part failed: mpirun's forwarding (then the rank gets the signal directly,
    # as slurmstepd sends it under SLURM) or mgbench's handling.
    ompi_info --param ess all --level 9 2>/dev/null | grep -i "forward_signals" | head -2 || true
    for f in /etc/openmpi/openmpi-mca-params.conf "$HOME/.openmpi/mca-params.conf"; do
      [[ -f $f ]] && grep -v "^\s*#\|^\s*$" "$f" | sed "s|^|$f: |"
    done
    kill -USR1 "$pid" 2>/dev/null || true
    for _ in $(seq 30); do
      grep -q "stopped on" "$OUT/preempt-1.log" 2>/dev/null && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if grep -q "stopped on" "$OUT/preempt-1.log"; then
      echo "SIGUSR1 to mpirun: forwarded, the rank stopped"
    elif kill -0 "$pid" 2>/dev/null; then
      echo "SIGUSR1 to mpirun: the rank ran on for 3 s; sending SIGUSR1 to the rank(s) directly (as slurmstepd does)"
      for rank_pid in $(pgrep -P "$pid"); do
        echo "rank pid $rank_pid before: $(grep -E "^(SigPnd|ShdPnd|SigBlk|SigCgt)" /proc/"$rank_pid"/status 2>/dev/null | tr '\n\t' '  ')"
      done
      pkill -USR1 -P "$pid" || true
    else
      echo "SIGUSR1 to mpirun: the run ended within 3 s without stopping"
    fi
    rc=0
    wait "$pid" || rc=$?
    echo "interrupted part: exit $rc (75 expected)"
    grep -E "checkpoint:|stopped on|preempted" "$OUT/preempt-1.log" | tail -4 || true
    mpirun -np 1 --bind-to none "$BUILD/app/mgbench" "${PREEMPT[@]}" --resume >"$OUT/preempt-2.log" 2>&1 ||
      { tail -20 "$OUT/preempt-2.log"; echo "gpu-check.sh: the resumed part failed"; }
    "$BUILD/app/mgbench" report "$OUT/preempt.h5" | tee "$OUT/preempt-report.txt" || true
  fi

  [[ ${CPU_TESTS:-1} == 1 ]] && stage "tests: unit, mpi, e2e (the GPU build)" &&
  (cd "$BUILD" && ctest -j 8 -L "unit|mpi|e2e" --timeout 600 >"$OUT/ctest.log" 2>&1) || true
  [[ ${CPU_TESTS:-1} == 1 ]] && { grep -E "tests passed|FAILED|\(Failed\)|\(Skipped\)|Not Run" "$OUT/ctest.log" || true; }
fi
fi  # DRY_RUN

BENCH_SETS=${BENCH_SETS:-image images io comm llm fsdp recipes}
# The sets whose commands go through run_cmd (below), and so can be shown by a dry run.
PAPER_SETS="table2 fig2 table3 cuda-metrics techniques graphs torchtune"
for set in $BENCH_SETS; do
  [[ " image images io comm llm fsdp recipes $PAPER_SETS " == *" $set "* ]] || echo "gpu-check.sh: BENCH_SETS: no set '$set'"
done
bench_set() {  # one of the words in BENCH_SETS
  [[ ${SKIP_BENCH:-0} != 1 && " $BENCH_SETS " == *" $1 "* ]] || return 1
  [[ $DRY_RUN != 1 || " $PAPER_SETS " == *" $1 "* ]] && return 0
  echo "dry run: set $1 not shown (its commands run directly, not through run_cmd)"
  return 1
}
if bench_set image; then
  stage "benchmark: mgbench vs Python torch peer, 1 GPU"
  for precision in ${BENCH_PRECISIONS:-fp32 fp16 amp-bf16}; do
    DEVICE=cuda NP=1 SIZES="${BENCH_SIZES:-224 500}" WARMUP=${BENCH_WARMUP:-10} QUICK=${QUICK:-0} BATCH=64 TRAIN=${BENCH_TRAIN:-4096} PRECISION=$precision PIN=true \
      TUNED_PEER=1 THREADS=8 PYTHON=$PYTHON MGBENCH="$BUILD/app/mgbench" bench/compare_image.sh "$DATA" 2>&1 | tee -a "$OUT/bench.txt" ||
      echo "gpu-check.sh: compare_image.sh $precision failed (above); going on with the next stage"
  done
fi
if bench_set io; then
  stage "benchmark: HtoD bytes per sample, device vs host upscaling (224 px, amp-bf16, pin_memory)"
  for upscale in device host; do
    mpirun -np 1 --bind-to none "$BUILD/app/mgbench" image --data "$DATA" --image-size 224 --batch-size 64 --limit-train 2048 \
      --limit-test 256 --epochs 1 --precision amp-bf16 --pin-memory true --upscale "$upscale" \
      --results "$OUT/htod.h5" --run-name "upscale-$upscale" --progress-interval 1000 >"$OUT/htod-$upscale.log" 2>&1 \
      || { tail -20 "$OUT/htod-$upscale.log"; echo "gpu-check.sh: mgbench --upscale $upscale failed; going on"; }
  done
  "$BUILD/app/mgbench" report --cuda --phases "$OUT/htod.h5" | tee "$OUT/htod-report.txt" || true
  stage "benchmark: checkpoint cost on the GPU (1 rank, 224 px, amp-bf16, a checkpoint every 16 steps vs none)"
  DEVICE=cuda NP=1 SIZE=224 BATCH=64 TRAIN=${BENCH_TRAIN:-4096} PRECISION=amp-bf16 EVERY=16 REPEATS=2 THREADS=8 \
    PYTHON=$PYTHON MGBENCH="$BUILD/app/mgbench" CKPT_DIR="$OUT/bench-ck" bench/compare_checkpoint.sh "$DATA" 2>&1 |
    tee "$OUT/checkpoint-bench.txt" || true
fi
if bench_set images; then
  # The second paper's scenario B: natively sized JPEGs decoded on the host (TurboJPEG on the loader's
  # threads) vs torchvision's DataLoader (PIL in worker processes); RandomResizedCrop to 224 px.
  for size in ${NATIVE_SIZES:-300 500}; do
    stage "benchmark: natively sized images, $size px JPEG (make-images of MNIST, quality 90): the loader alone, then training"
    "$BUILD/app/mgbench" data make-images --data "$DATA" --out "$OUT/native-$size" --image-size "$size" \
      --limit-train "${BENCH_TRAIN:-4096}" --limit-test 256 --threads "$(nproc)" || true
    if [[ ${NATIVE_PEER_MODELS:-all} != none ]]; then
      DATA="$OUT/native-$size" CROP_SIZE=224 THREADS="${NATIVE_WORKERS:-8}" REPEATS=1 PYTHON=$PYTHON \
        MGBENCH="$BUILD/app/mgbench" bench/compare_loader.sh 2>&1 | tee -a "$OUT/bench.txt" || true
    fi
    for model in ${NATIVE_MODELS:-mobilenet_v2 resnet50}; do
      if [[ ${NATIVE_PEER_MODELS:-all} == all || " ${NATIVE_PEER_MODELS:-} " == *" $model "* ]]; then
        DEVICE=cuda NP=1 DATASET=imagefolder MODEL=$model WORKERS=${NATIVE_WORKERS:-8} SIZES=224 \
          WARMUP=${BENCH_WARMUP:-10} BATCH=64 TRAIN=${BENCH_TRAIN:-4096} PRECISION=amp-bf16 PIN=true THREADS=8 \
          QUICK=${QUICK:-0} PYTHON=$PYTHON MGBENCH="$BUILD/app/mgbench" bench/compare_image.sh "$OUT/native-$size" 2>&1 |
          tee -a "$OUT/bench.txt" || echo "gpu-check.sh: the $model table at $size px failed (above); going on"
      fi
      # The DataLoader-vs-DALI question: JPEGs decoded on the loader's threads vs by nvJPEG on the GPU,
      # with each of its back-ends (the JPEG engines, Huffman on the GPU, Huffman on the CPU per image).
      for decode in ${NATIVE_DECODES:-host hardware gpu-hybrid hybrid}; do
        how=(--decode device --nvjpeg-backend "$decode")
        [[ $decode == host ]] && how=(--decode host)
        mpirun -np 1 --bind-to none "$BUILD/app/mgbench" image --dataset imagefolder --data "$OUT/native-$size" \
          --model "$model" --image-size 224 --batch-size 64 --limit-train "${BENCH_TRAIN:-4096}" --limit-test 256 \
          --epochs "${NATIVE_EPOCHS:-1}" --precision amp-bf16 --pin-memory true --loader-threads "${NATIVE_WORKERS:-8}" "${how[@]}" \
          --warmup-steps-excluded "${BENCH_WARMUP:-10}" --cupti false --results "$OUT/decode.h5" \
          --run-name "$model-$size-$decode" --progress-interval 1000 >"$OUT/decode-$model-$size-$decode.log" 2>&1 ||
          { tail -5 "$OUT/decode-$model-$size-$decode.log"; echo "gpu-check.sh: --decode $decode failed; going on"; }
        grep -h "decode device: nvJPEG" "$OUT/decode-$model-$size-$decode.log" || true
      done
      # The shares of the step, over the epochs after the first (whose time is mostly cuDNN's
      # autotuning): waiting for the input pipeline (data: the loader, and with --decode device the
      # feeder's thread, which runs nvJPEG behind the copies on the copy stream), for the batch's copies
      # and decoding still on the GPU (h2d), the step's own transform (upscaling; no decoding).
      "$PYTHON" -c "import h5py, sys
for run in h5py.File(sys.argv[1])['runs'].values():
    if not run.attrs['run_name'].startswith(sys.argv[2]): continue
    s, epochs = run['summary'][0], run['rank_0/epochs'][:]
    e = epochs[1:] if len(epochs) > 1 else epochs
    share = lambda phase: 100 * e[phase].sum() / e['train_s'].sum()
    print('decode', run.attrs['run_name'], 'img/s %.1f' % s['samples_per_s'], 'data %.1f %%, h2d %.1f %%, transform %.1f %%'
          % (share('data_s'), share('h2d_s'), share('transform_s')),
          'of epochs 2-%d' % len(epochs) if len(epochs) > 1 else 'of epoch 1')
" "$OUT/decode.h5" "$model-$size-" | tee -a "$OUT/bench.txt" || true
    done
  done
fi
if bench_set comm; then
  GPUS=$(visible_gpus)
  ((GPUS >= 1)) || GPUS=1
  stage "benchmark: mgbench comm over NCCL, $GPUS rank(s), one per GPU (a single GPU checks the path, not a link)"
  mpirun -np "$GPUS" --bind-to none "$BUILD/app/mgbench" comm --backend nccl --collective all --min-bytes 8 \
    --max-bytes 1G --step-factor 4 --results "$OUT/comm.h5" 2>&1 | tee "$OUT/comm-nccl.txt" || true
  # nccl-tests beside it, on the same machine, where a build is given (NCCL_TESTS: its build/ folder).
  if [[ -x ${NCCL_TESTS:-}/all_reduce_perf ]]; then
    for c in all_reduce all_gather reduce_scatter broadcast; do
      mpirun -np "$GPUS" --bind-to none "$NCCL_TESTS/${c}_perf" -b 8 -e 1G -f 4 -g 1 2>&1 | tee -a "$OUT/nccl-tests.txt" || true
    done
  else
    echo "# nccl-tests: not run (set NCCL_TESTS to the build/ folder of github.com/NVIDIA/nccl-tests, built with MPI=1)"
  fi
  stage "predict: 2-8 GPUs of the 224 px amp-bf16 workload from its 1-GPU run and this comm run"
  if [[ -f "$OUT/htod.h5" ]]; then
    "$BUILD/app/mgbench" predict "$OUT/htod.h5" --comm "$OUT/comm.h5" --ranks 1,2,4,8 --link h100-nvlink \
      --results "$OUT/predictions.h5" | tee "$OUT/predict.txt" || true
  fi
fi
SHARED_DATA=$(dirname "$DATA")
# The LLM runs' data: Llama 3's tokenizer and alpaca-cleaned's first rows (the paper's dataset), or
# TorchTune's stack_exchange_paired sample for DPO.
LLM_ALPACA=(--tokenizer "$SHARED_DATA/llama3/tokenizer.model" --dataset alpaca
  --data "$SHARED_DATA/text/alpaca/alpaca_cleaned_first5k.json")
LLM_PAIRS=(--tokenizer "$SHARED_DATA/llama3/tokenizer.model" --dataset stack_exchange_paired
  --data "$SHARED_DATA/text/dpo/stack_exchange_paired_tiny_torchtune.json")
if bench_set llm; then
  stage "benchmark: mgbench llm, llama3-8b shape, random init, bf16, batch 2, alpaca (paper: 0.77 s/it on 1 H100)"
  "$BUILD/app/mgbench" llm --model llama3-8b --init random "${LLM_ALPACA[@]}" --batch-size 2 --max-steps 20 \
    --precision bf16 --results "$OUT/llm.h5" --run-name llama3-8b --progress-interval 5 2>&1 | tail -5 || true
  # Issue 33: the same rows unpadded -- packed, one varlen flash-attention call per layer, fused RMSNorm.
  stage "benchmark: the same with --padding none (packed sequences; the report's tokens/s vs padded/s)"
  "$BUILD/app/mgbench" llm --model llama3-8b --init random "${LLM_ALPACA[@]}" --batch-size 2 --max-steps 20 \
    --precision bf16 --padding none --results "$OUT/llm.h5" --run-name llama3-8b-unpadded --progress-interval 5 \
    2>&1 | tail -5 || true
  "$BUILD/app/mgbench" report --phases "$OUT/llm.h5" | tee "$OUT/llm-report.txt" || true
  stage "benchmark: mgbench llm --recipe dpo, llama3.1-8b shape, random init, bf16, batch 4 pairs, stack_exchange_paired"
  "$BUILD/app/mgbench" llm --recipe dpo --model llama3.1-8b --init random "${LLM_PAIRS[@]}" --batch-size 4 --grad-accum 1 \
    --max-steps 5 --epochs 1 --results "$OUT/llm.h5" --run-name llama3.1-8b-dpo --progress-interval 5 2>&1 | tail -5 || true
  "$BUILD/app/mgbench" report "$OUT/llm.h5" | tee "$OUT/dpo-report.txt" || true
  stage "benchmark: mgbench llm --recipe qlora, llama3-8b shape (NF4 projections), random init, bf16, batch 2, alpaca"
  "$BUILD/app/mgbench" llm --recipe qlora --model llama3-8b --init random "${LLM_ALPACA[@]}" \
    --batch-size 2 --grad-accum 1 --max-steps 10 \
    --results "$OUT/llm.h5" --run-name llama3-8b-qlora --progress-interval 5 2>&1 | tail -5 || true
  "$BUILD/app/mgbench" report "$OUT/llm.h5" | tee "$OUT/qlora-report.txt" || true  # LoRA and QLoRA 8B: s/it, peak memory
  # Issue 32 item 3: the host waits of each recipe per optimizer step (QLoRA used to copy its NF4
  # code table to the device with a blocking copy in every NF4 layer call: ~672 a micro-batch on 8B).
  "$PYTHON" -c "import h5py, sys
for run in h5py.File(sys.argv[1])['runs'].values():
    if 'rank_0/cuda_api' not in run: continue
    api = {r['name'].split(b'\0')[0].decode(): r['calls'] for r in run['rank_0/cuda_api'][:]}
    steps = int((run['rank_0/steps'][:]['epoch'] >= 0).sum()) or 1
    print('host syncs per step,', run.attrs['run_name'], run.attrs['recipe'], {n: round(api.get(n, 0) / steps, 1)
          for n in ('cudaStreamSynchronize', 'cudaDeviceSynchronize', 'cudaEventSynchronize', 'cudaMemcpyAsync')})
" "$OUT/llm.h5" | tee -a "$OUT/qlora-report.txt" || true
fi
if bench_set fsdp; then
  # FSDP on the GPU (issue 28): 2 ranks, one per GPU over NCCL -- or, on a machine with one GPU, both
  # on it over the MPI backend (NCCL refuses two ranks on one device): the CUDA path of the sharding
  # (storage freed and regathered, the reduce-scatter, the optimizer on shards) and its memory.
  FSDP_GPUS=$(visible_gpus)
  FSDP_BACKEND=$( ((FSDP_GPUS >= 2)) && echo nccl || echo mpi)
  fsdp_failed() { echo "gpu-check.sh: fsdp: the run above FAILED (its last lines above)"; }
  stage "FSDP: llama3.2-1b shape, full fine-tuning, bf16, AdamW, 2 ranks over $FSDP_BACKEND: --sharding fsdp vs none"
  for sharding in fsdp none; do
    mpirun -np 2 --bind-to none "$BUILD/app/mgbench" llm --recipe full --model llama3.2-1b --init random \
      "${LLM_ALPACA[@]}" --batch-size 2 --max-steps 10 \
      --max-seq-len 512 --backend "$FSDP_BACKEND" --sharding "$sharding" --results "$OUT/fsdp.h5" \
      --run-name "full-$sharding" --progress-interval 5 2>&1 | tail -3 ||
    fsdp_failed
  done
  "$BUILD/app/mgbench" report "$OUT/fsdp.h5" | tee "$OUT/fsdp-report.txt" || true  # s/it and peak memory of both
  "$PYTHON" -c "import h5py, sys
for run in h5py.File(sys.argv[1])['runs'].values():
    a = run.attrs
    print(a['run_name'], a['sharding'], 'parameter/gradient/optimizer bytes per rank:',
          a['parameter_bytes_per_rank'], a['gradient_bytes_per_rank'], a['optimizer_state_bytes_per_rank'],
          'peak', run['summary'][0]['peak_memory_bytes'])" "$OUT/fsdp.h5" | tee -a "$OUT/fsdp-report.txt" || true
  stage "FSDP: QLoRA (NF4 base gathered packed) and the image recipe (MobileNetV2's units), 2 ranks over $FSDP_BACKEND"
  mpirun -np 2 --bind-to none "$BUILD/app/mgbench" llm --recipe qlora --model llama3.2-1b --init random \
    "${LLM_ALPACA[@]}" --batch-size 2 --max-steps 10 \
    --max-seq-len 512 --backend "$FSDP_BACKEND" --sharding fsdp --results "$OUT/fsdp.h5" \
    --run-name qlora-fsdp --progress-interval 5 2>&1 | tail -3 ||
    fsdp_failed
  for sharding in fsdp none; do
    mpirun -np 2 --bind-to none "$BUILD/app/mgbench" image --data "$SHARED_DATA/mnist" --image-size 224 \
      --limit-train 2048 --limit-test 512 --epochs 1 --batch-size 64 --precision amp-fp16 --channels-last true \
      --backend "$FSDP_BACKEND" --sharding "$sharding" --results "$OUT/fsdp.h5" --run-name "image-$sharding" \
      --progress-interval 5 2>&1 | tail -2 ||
    fsdp_failed
  done
  "$BUILD/app/mgbench" report "$OUT/fsdp.h5" | tee -a "$OUT/fsdp-report.txt" || true
  # HtoD by what made it (issue 32 item 1): with the MPI backend, the collectives' staging apart.
  "$BUILD/app/mgbench" report --cuda "$OUT/fsdp.h5" | grep -A4 "^# .*CUDA activity" | tee -a "$OUT/fsdp-report.txt" || true
  # Issue 48: a checkpoint loaded a shard at a time. mgbench writes a random llama3.2-3b (6.4 GB bf16,
  # one file, streamed a unit at a time), then 2 ranks load their rows of it and train LoRA sharded:
  # each rank's load time and memory when its set-up ended, and its peak while training.
  stage "FSDP: llama3.2-3b loaded from a checkpoint a shard per rank, LoRA, 2 ranks over $FSDP_BACKEND"
  mpirun -np 2 --bind-to none "$BUILD/app/mgbench" llm --recipe full --model llama3.2-3b --init random \
    "${LLM_ALPACA[@]}" --batch-size 1 --max-steps 1 --max-seq-len 256 --backend "$FSDP_BACKEND" --sharding fsdp \
    --results "$OUT/fsdp-export.h5" --output-dir "$OUT/llama3.2-3b-random" 2>&1 | tail -2 ||
    fsdp_failed
  mpirun -np 2 --bind-to none "$BUILD/app/mgbench" llm --recipe lora --model "$OUT/llama3.2-3b-random" \
    "${LLM_ALPACA[@]}" --batch-size 2 --max-steps 10 --max-seq-len 512 --backend "$FSDP_BACKEND" --sharding fsdp \
    --results "$OUT/fsdp.h5" --run-name lora-3b-loaded --progress-interval 5 2>&1 | tail -3 ||
    fsdp_failed
  rm -rf "$OUT/llama3.2-3b-random"  # 6.4 GB: not a result
  "$PYTHON" -c "import h5py, sys
for run in h5py.File(sys.argv[1])['runs'].values():
    if run.attrs['run_name'] != 'lora-3b-loaded': continue
    for r in range(int(run.attrs['world_size'])):
        a = run[f'rank_{r}'].attrs
        print(f'lora-3b-loaded rank {r}: load (set-up) {a[\"setup_s\"]:.1f} s, memory at its end',
              f'{a[\"setup_peak_memory_bytes\"] / 2**30:.2f} GiB; run peak',
              f'{run[\"summary\"][0][\"peak_memory_bytes\"] / 2**30:.2f} GiB (rank 0)')" "$OUT/fsdp.h5" \
    | tee -a "$OUT/fsdp-report.txt" || true
  stage "FSDP: the memory plan of llama3-8b full fine-tuning (bf16, AdamW) at 1, 2, 4, 8 ranks against this GPU"
  "$BUILD/app/mgbench" llm --recipe full --model llama3-8b --init random --precision bf16 \
    "${LLM_ALPACA[@]}" --dry-run | tee -a "$OUT/fsdp-report.txt" || true
fi
if bench_set recipes; then
  stage "benchmark: every recipe vs LoRA (qlora, qat-lora, full, qat), llama3.2-1b shape, 1 GPU, bf16"
  DEVICE=cuda MODEL=llama3.2-1b STEPS=10 BATCH=2 MAX_SEQ_LEN=512 PYTHON=$PYTHON MGBENCH="$BUILD/app/mgbench" \
    bench/compare_recipes.sh "$SHARED_DATA" 2>&1 | tee -a "$OUT/bench.txt" || true
  stage "benchmark: DPO vs its Python peer (tiny Llama, CPU side of the machine)"
  RECIPE=dpo PYTHON=$PYTHON MGBENCH="$BUILD/app/mgbench" bench/compare_llm.sh "$SHARED_DATA" 2>&1 | tee -a "$OUT/bench.txt" || true
fi
# The papers' settings (issue 49): the sets of the header's list. Each is one 8-minute call on an
# H100: the build (BUILD_TARGETS="mgbench mgbench-report", SKIP_TESTS=1) and SET_BUDGET_S of runs, sized
# by limited images and steps; a run that would start later is named as skipped, one that starts in
# time is stopped SET_GRACE_S after the budget. Their commands go through run_cmd, so DRY_RUN shows them.
MGBENCH=$BUILD/app/mgbench
SET_BUDGET_S=${SET_BUDGET_S:-300}
SET_GRACE_S=${SET_GRACE_S:-45}
SET_T0=$T0
set_start() { SET_T0=$(date +%s); stage "$*"; }
set_has_time() {  # $*: the run, named in the line that says it was skipped
  local spent=$(($(date +%s) - SET_T0))
  ((spent < SET_BUDGET_S)) && return 0
  echo "gpu-check.sh: skipped for time (SET_BUDGET_S=$SET_BUDGET_S s, $spent s spent): $*"
  return 1
}
# Prints the command ("+ ..."; shell-quoted, so a test can split it as the shell would) and, unless
# DRY_RUN=1, runs it; with --log FILE its output goes to FILE, whose tail is shown when it fails.
run_cmd() {
  local log=""
  [[ $1 == --log ]] && { log=$2; shift 2; }
  printf '+'; printf ' %q' "$@"; printf '\n'
  [[ $DRY_RUN == 1 ]] && return 0
  local left=$((SET_T0 + SET_BUDGET_S + SET_GRACE_S - $(date +%s))) rc=0
  ((left > 30)) || left=30  # runs start within the budget; this leaves the set's report its time
  if [[ -n $log ]]; then
    timeout -k 20 "$left" "$@" >"$log" 2>&1 || rc=$?
    ((rc == 0)) || grep -v "^#" "$log" | tail -15
  else
    timeout -k 20 "$left" "$@" || rc=$?
  fi
  ((rc != 124)) || echo "gpu-check.sh: stopped at the set's time limit (SET_BUDGET_S + SET_GRACE_S): $*"
  return "$rc"
}
# One image run at Table 2's settings (inputs/configs/paper-table2.ini: DDP-DS, 500 px, batch 64,
# pin_memory false), "$@" over them, into $OUT/<set>.h5, the log beside it; $1 the set, $2 the run.
# "$@" must not repeat an option given here (mgbench refuses an option twice): what a set varies of
# these comes in PAPER_TRAIN (images), PAPER_EPOCHS (1) and PAPER_CUPTI (false: the paper's times are
# not a traced run's). Evaluation of 512 test images: the sets time training. The first BENCH_WARMUP
# steps (cuDNN's autotuning) are left out of the summary's img/s.
paper_image() {
  local set=$1 name=$2
  shift 2
  set_has_time "$set: $name" || return 0
  run_cmd --log "$OUT/$set-$name.log" "${PAPER_LAUNCH[@]}" "$MGBENCH" image --config inputs/configs/paper-table2.ini \
    --data "$DATA" --device cuda --limit-train "${PAPER_TRAIN:-2048}" --limit-test 512 --epochs "${PAPER_EPOCHS:-1}" \
    --warmup-steps-excluded "${BENCH_WARMUP:-10}" --cupti "${PAPER_CUPTI:-false}" --results "$OUT/$set.h5" \
    --run-name "$set-$name" --progress-interval 1000 "$@" || echo "gpu-check.sh: $set $name failed (above); going on"
}
PAPER_LAUNCH=()  # one rank: mgbench started alone (a singleton MPI job), so a timeout's signal reaches it
paper_report() {  # $1: the set; "$@": report's options
  local set=$1
  shift
  [[ $DRY_RUN == 1 || -f $OUT/$set.h5 ]] || return 0
  run_cmd "$MGBENCH" report "$@" "$OUT/$set.h5" || true
}
if bench_set table2; then
  # The paper's FP32 on an H100 is PyTorch's default, whose cuDNN convolutions may use TF32: fp32 (TF32
  # off) and tf32 (on) bracket it. 20 epochs of 60,000 images do not fit a call: TABLE2_EPOCHS short
  # epochs run, all but the first (cuDNN's autotuning) are timed, and `mgbench report --paper` projects.
  set_start "Table 2 (2503.15252): MobileNetV2, 1 GPU, 500 px, batch 64, pin_memory false, every precision"
  # fp16 first (the issue's goal), then the paper's other rows, then mgbench's own; what the budget skips
  # runs in a next call with TABLE2_PRECISIONS naming it.
  for precision in ${TABLE2_PRECISIONS:-fp16 fp64 fp32 tf32 amp-bf16}; do
    PAPER_TRAIN=${TABLE2_TRAIN:-2048} PAPER_EPOCHS=${TABLE2_EPOCHS:-3} \
      paper_image table2 "$precision" --precision "$precision"
  done
  paper_report table2 --paper --energy
fi
if bench_set fig2; then
  set_start "Fig. 2 (2503.15252): fp64, DDP-DS, 1 GPU, 100-500 px, pin_memory false"
  for size in ${FIG2_SIZES:-100 200 300 400 500}; do
    paper_image fig2 "${size}px" --precision fp64 --image-size "$size"
  done
  paper_report fig2
fi
if bench_set table3; then
  # The paper's pipeline resizes on the host: --upscale host sends float 3 x 500 x 500 images (3 MB a
  # sample) over PCIe, which is what pinning speeds up. mgbench's fp32 (TF32 off); table2's tf32 row
  # shows what TF32, which the paper's PyTorch may have used in cuDNN, would change.
  set_start "Table 3 (2503.15252): fp32, 1 GPU, 500 px, host-side upscaling, pin_memory false vs true"
  for pin in false true; do
    paper_image table3 "pin-$pin" --precision fp32 --upscale host --pin-memory "$pin"
  done
  paper_report table3 --paper --energy
fi
if bench_set cuda-metrics; then
  # Fig. 3: FP32, 100 and 500 px, pin_memory true / false, on 2 and 4 GPUs in the paper; here on the GPUs
  # there are (at most 4; one GPU has no NCCL kernel, so no AllGather share). The window opens after
  # the first BENCH_WARMUP steps: cuDNN's autotuning would fill most of a run this short, where it was
  # a sliver of the paper's 720 s window.
  CUDA_METRICS_NP=${CUDA_METRICS_NP:-$(visible_gpus)}
  ((CUDA_METRICS_NP >= 1)) || CUDA_METRICS_NP=1
  ((CUDA_METRICS_NP <= 4)) || CUDA_METRICS_NP=4
  ((CUDA_METRICS_NP == 1)) || PAPER_LAUNCH=(mpirun -np "$CUDA_METRICS_NP" --bind-to none)
  set_start "Figs. 3 and 5 (2503.15252): CUPTI's API and kernel shares, fp32, $CUDA_METRICS_NP GPU(s), 100 / 500 px," \
    "host upscaling, pin_memory false / true; LoRA fp32"
  for size in 100 500; do
    for pin in false true; do
      PAPER_CUPTI=true paper_image cuda-metrics "${size}px-pin-$pin" --precision fp32 --image-size "$size" \
        --upscale host --pin-memory "$pin" --profile-window "steps:${BENCH_WARMUP:-10}:0"
    done
  done
  PAPER_LAUNCH=()
  # Fig. 5: LoRA on llama3-8b, fp32, one GPU, alpaca-cleaned, batch 2 (the paper's settings).
  if set_has_time "cuda-metrics: Fig. 5, llama3-8b LoRA fp32"; then
    run_cmd --log "$OUT/cuda-metrics-lora.log" "$MGBENCH" llm --recipe lora --model llama3-8b --init random \
      "${LLM_ALPACA[@]}" --batch-size 2 --max-steps "${TECHNIQUES_STEPS:-10}" --precision fp32 --device cuda \
      --cupti true --profile-window steps:2:0 --results "$OUT/cuda-metrics.h5" --run-name cuda-metrics-lora-fp32 \
      --progress-interval 1000 || echo "gpu-check.sh: cuda-metrics LoRA failed (above); going on"
  fi
  paper_report cuda-metrics --cuda
fi
if bench_set techniques; then
  # 2505.22905's comparison of fine-tuning techniques, on one GPU: s/it, peak VRAM, HtoD bytes a step.
  # The smaller model first, so that every technique has a row before the budget runs out on the 8B ones.
  set_start "techniques: ${TECHNIQUES_RECIPES:-full lora qlora qat dpo} on ${TECHNIQUES_MODELS:-llama3.2-3b llama3-8b}," \
    "1 GPU, bf16, batch 2, max_seq_len 512"
  for model in ${TECHNIQUES_MODELS:-llama3.2-3b llama3-8b}; do
    for recipe in ${TECHNIQUES_RECIPES:-full lora qlora qat dpo}; do
      set_has_time "techniques: $recipe on $model" || continue
      data=("${LLM_ALPACA[@]}")
      [[ $recipe == dpo ]] && data=("${LLM_PAIRS[@]}")
      run_cmd --log "$OUT/techniques-$model-$recipe.log" "$MGBENCH" llm --recipe "$recipe" --model "$model" \
        --init random "${data[@]}" --batch-size 2 --max-steps "${TECHNIQUES_STEPS:-10}" --max-seq-len 512 \
        --device cuda --warmup-steps-excluded 2 --results "$OUT/techniques.h5" --run-name "$model-$recipe" \
        --progress-interval 1000 || echo "gpu-check.sh: techniques $recipe on $model failed (above); going on"
    done
  done
  paper_report techniques --cuda --energy  # s/it and peak memory (the LLM table), HtoD bytes, J/token
  # The inter-GPU traffic at 2 ranks from each run's own collective accounting (FSDP's gathers and
  # reduce-scatters; predict's `link` column, MiB a rank's link carries per step), and its time on NVLink.
  if [[ $DRY_RUN == 1 || -f $OUT/techniques.h5 ]]; then
    run_cmd "$MGBENCH" predict "$OUT/techniques.h5" --ranks 1,2 --link h100-nvlink \
      --results "$OUT/techniques-predicted.h5" || true
  fi
fi
if bench_set graphs; then
  # Issue 47, item 4: --cuda-graphs on against off, the same runs otherwise, where the host's launches
  # weigh most (small images) and least (the paper's 500 px). Their first BENCH_WARMUP steps (the
  # warm-up and the captures) are left out of img/s; `report --cuda` puts the kernel launches beside.
  set_start "CUDA graphs (issue 47), --cuda-graphs off vs on, 1 GPU: LoRA bf16 on ${GRAPHS_LLM_MODELS:-llama3.2-1b llama3-8b}," \
    "then MobileNetV2, batch 64, ${GRAPHS_PRECISIONS:-amp-bf16 fp32} at ${GRAPHS_SIZES-100 224 500} px"
  # First (the set's budget may stop it before the rest), the LLM step (LoRA, bf16, batch 2, alpaca;
  # padded rows and packed ones, both rounded up to multiples of 64 tokens on both sides: a bounded
  # set of shapes, one graph each), where the host's launches of every decoder layer's ops weigh.
  for model in ${GRAPHS_LLM_MODELS:-llama3.2-1b llama3-8b}; do
    for padding in ${GRAPHS_LLM_PADDINGS:-pad none}; do
      for graphs in off on; do
        set_has_time "graphs: $model LoRA $padding --cuda-graphs $graphs" || continue
        run_cmd --log "$OUT/graphs-$model-$padding-$graphs.log" "$MGBENCH" llm --model "$model" --init random \
          "${LLM_ALPACA[@]}" --batch-size 2 --max-steps "${GRAPHS_LLM_STEPS:-30}" --max-seq-len 512 \
          --padding "$padding" --pad-to-multiple 64 --device cuda --cuda-graphs "$graphs" \
          --warmup-steps-excluded 10 --cupti false --results "$OUT/graphs.h5" \
          --run-name "$model-lora-$padding-$graphs" --progress-interval 1000 ||
          echo "gpu-check.sh: graphs $graphs on $model ($padding) failed (above); going on"
      done
    done
  done
  for size in ${GRAPHS_SIZES-100 224 500}; do
    for precision in ${GRAPHS_PRECISIONS:-amp-bf16 fp32}; do
      for graphs in off on; do
        PAPER_CUPTI=true paper_image graphs "${size}px-$precision-$graphs" --precision "$precision" \
          --image-size "$size" --cuda-graphs "$graphs" --profile-window "steps:${BENCH_WARMUP:-10}:0"
      done
    done
  done
  # DDP over the node's GPUs (--backend auto: NCCL, one rank a GPU), each rank replaying its own micro-batches and the
  # gradients all-reduced after backward (no overlap): what graphs win against what the overlap lost.
  # On one GPU the 2-rank path is the GPU test CudaGraphs.DdpRanksReplaying... (MPI backend) instead.
  GRAPHS_DDP_NP=${GRAPHS_DDP_NP:-$(visible_gpus)}
  if ((GRAPHS_DDP_NP >= 2)); then
    PAPER_LAUNCH=(mpirun -np "$GRAPHS_DDP_NP" --bind-to none)
    for graphs in off on; do
      paper_image graphs "ddp$GRAPHS_DDP_NP-224px-amp-bf16-$graphs" --precision amp-bf16 --image-size 224 \
        --cuda-graphs "$graphs"  # timed without CUPTI: no --profile-window (refused with --cupti false)
    done
    PAPER_LAUNCH=()
  else
    echo "graphs: no DDP rows (one GPU; NCCL takes one rank a GPU)"
  fi
  paper_report graphs --cuda
fi
if bench_set torchtune; then
  # Issue 47 item 1: each side's runs on the same rows (alpaca's first, in order: --shuffle false on both),
  # batch, grad-accum 1, precision, no activation checkpointing, LoRA r 8 on q, v, o and the MLP, the
  # prompt's tokens in the loss on both for SFT (so TorchTune's logged tokens are the real ones). The first
  # PEERS_WARMUP steps are left out on both sides (TorchTune's compile, mgbench's first allocations).
  # Packed: TorchTune's packs of 2 x 2048 tokens against mgbench's --padding none micro-batches of as many
  # rows as a TorchTune step held (its samples_per_step; PEERS_PACKED_ROWS until one ran).
  set_start "TorchTune beside mgbench (issue 47): llama3-8b LoRA bf16 batch 2 alpaca; DPO and full on llama3.2-1b"
  PEERS_STEPS=${PEERS_STEPS:-20}
  PEERS_WARMUP=${PEERS_WARMUP:-5}
  # Stated on both sides where a recipe's defaults differ (mgbench's dpo and full turn activation checkpointing on).
  SAME=(--tokenizer "$SHARED_DATA/llama3/tokenizer.model" --grad-accum 1 --shuffle false --seed 42
    --activation-checkpointing false --warmup-steps-excluded "$PEERS_WARMUP")
  # The first 1,000 rows (20 packed steps take ~900; TorchTune packs every row it is given before step 1).
  ALPACA_DATA=(--dataset alpaca --data "$SHARED_DATA/text/alpaca/alpaca_cleaned_first5k.json" --limit 1000
    --train-on-input --max-steps "$PEERS_STEPS")
  PAIRS_DATA=(--dataset stack_exchange_paired --data "$SHARED_DATA/text/dpo/stack_exchange_paired_tiny_torchtune.json"
    --max-steps 10)  # its 25 pairs: 12 steps of 2
  PEER_JSONL=$OUT/torchtune-peer.jsonl
  peers_wanted() { [[ " ${PEERS_RUNS:-all} " == *" all "* || " ${PEERS_RUNS:-} " == *" $1 "* ]] && set_has_time "torchtune: $1"; }
  ours() {  # $1: the run's key; the rest: mgbench llm's options beyond SAME
    local key=$1
    shift
    peers_wanted "$key" || return 0
    run_cmd --log "$OUT/torchtune-$key.log" "$MGBENCH" llm "${SAME[@]}" --device cuda --init random \
      --results "$OUT/torchtune.h5" --run-name "mgbench-$key" --progress-interval 1000 "$@" ||
      echo "gpu-check.sh: torchtune set, $key failed (above); going on"
  }
  theirs() {  # the same for bench/peer_torchtune.py
    local key=$1
    shift
    peers_wanted "$key" || return 0
    run_cmd --log "$OUT/torchtune-$key.log" env "PYTHONPATH=$TORCHTUNE_SITE" "HF_DATASETS_CACHE=$OUT/hf-datasets" \
      "$PYTHON" bench/peer_torchtune.py "${SAME[@]}" --device cuda --init random --out "$PEER_JSONL" --run-name "$key" "$@" ||
      echo "gpu-check.sh: torchtune set, $key failed (above); going on"
  }
  # LoRA and DPO on both sides: cosine after 100 warm-up steps (TorchTune's configs; mgbench's defaults).
  LORA8B=(--recipe lora --model llama3-8b "${ALPACA_DATA[@]}")
  PAD_BF16=(--batch-size 2 --precision bf16)
  PACKED_BF16=(--precision bf16 --padding none --max-seq-len 2048)  # mgbench's batch: PACKED_ROWS, below
  ours lora-pad-bf16 "${LORA8B[@]}" "${PAD_BF16[@]}" --cupti false
  theirs torchtune-lora-pad-bf16-eager "${LORA8B[@]}" "${PAD_BF16[@]}"
  theirs torchtune-lora-packed-bf16-eager "${LORA8B[@]}" "${PACKED_BF16[@]}" --batch-size 2
  PACKED_ROWS=${PEERS_PACKED_ROWS:-21}
  if [[ $DRY_RUN != 1 && -f $PEER_JSONL ]]; then
    PACKED_ROWS=$("$PYTHON" -c "import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r['run_name'] == 'torchtune-lora-packed-bf16-eager']
print(round(rows[-1]['samples_per_step']) if rows else sys.argv[2])" "$PEER_JSONL" "$PACKED_ROWS")
  fi
  ours lora-packed-bf16 "${LORA8B[@]}" "${PACKED_BF16[@]}" --batch-size "$PACKED_ROWS" --cupti false
  theirs torchtune-lora-pad-bf16-compile "${LORA8B[@]}" "${PAD_BF16[@]}" --compile true
  theirs torchtune-lora-packed-bf16-compile "${LORA8B[@]}" "${PACKED_BF16[@]}" --batch-size 2 --compile true
  # The paper's Table 5 setting: FP32, padded (0.77 s/it on one H100 there).
  ours lora-pad-fp32 "${LORA8B[@]}" --batch-size 2 --precision fp32 --cupti false
  theirs torchtune-lora-pad-fp32-eager "${LORA8B[@]}" --batch-size 2 --precision fp32
  # CUPTI's own cost: the first run again, traced (not paired with TorchTune's rows).
  ours lora-pad-bf16-cupti "${LORA8B[@]}" "${PAD_BF16[@]}" --cupti true
  # One row each of DPO (lr 5e-4, weight decay 0.05: its TorchTune config's) and full fine-tuning.
  DPO1B=(--recipe dpo --model llama3.2-1b --batch-size 2 --max-seq-len 1024 "${PAIRS_DATA[@]}" --precision bf16
    --lr 5e-4 --weight-decay 0.05)
  ours dpo-pad-bf16 "${DPO1B[@]}" --cupti false
  theirs torchtune-dpo-pad-bf16-eager "${DPO1B[@]}"
  FULL1B=(--recipe full --model llama3.2-1b --batch-size 2 --max-seq-len 512 "${ALPACA_DATA[@]}" --precision bf16
    --lr 2e-5 --lr-schedule constant --warmup-steps 0)  # mgbench's full defaults (TorchTune's full configs')
  ours full-pad-bf16 "${FULL1B[@]}" --cupti false
  theirs torchtune-full-pad-bf16-eager "${FULL1B[@]}"
  if [[ $DRY_RUN == 1 || (-f $OUT/torchtune.h5 && -f $PEER_JSONL) ]]; then
    run_cmd "$PYTHON" bench/llm_peers.py "$OUT/torchtune.h5" "$PEER_JSONL" --csv "$OUT/llm_peers.csv" --markdown || true
  fi
  paper_report torchtune --cuda
fi
if [[ ${SKIP_BENCH:-0} != 1 && $DRY_RUN != 1 ]] && command -v nsys >/dev/null; then
  # Issue 32 item 8: the GPU time under each NVTX range, projected from the thread that launched it
  # (backward's kernels and GradSync's all-reduces come from autograd's thread).
  NVTX_BACKEND=$( (($(visible_gpus) >= 2)) && echo nccl || echo mpi)
  stage "NVTX: GPU time by range under Nsight Systems (2 ranks over $NVTX_BACKEND, 64 px, 8 steps)"
  mpirun -np 2 --bind-to none nsys profile -t cuda,nvtx -o "$OUT/nvtx-%q{OMPI_COMM_WORLD_RANK}" --force-overwrite true \
    "$BUILD/app/mgbench" image --data "$DATA" --image-size 64 --limit-train 1024 \
    --limit-test 64 --epochs 1 --batch-size 64 --max-steps 8 --cupti false --backend "$NVTX_BACKEND" \
    --results "$OUT/nvtx.h5" --progress-interval 1000 >"$OUT/nvtx.log" 2>&1 || tail -5 "$OUT/nvtx.log"
  for rep in "$OUT"/nvtx-*.nsys-rep; do
    [[ -f $rep ]] && nsys stats -q -r nvtx_gpu_proj_sum -f csv "$rep" 2>/dev/null | head -20 | tee -a "$OUT/nvtx.txt" || true
  done
fi
if [[ $DRY_RUN != 1 ]] && compgen -G "$OUT/*.h5" >/dev/null; then
  stage "figures of every results file above (the CUDA ones, Figs. 3, 5, 6, need these GPU runs): $OUT/figures"
  "$BUILD/app/mgbench" report --plot "$OUT/figures" "$OUT"/*.h5 >/dev/null || echo "# figures: mgbench-plot failed (above)"
fi
[[ $DRY_RUN == 1 ]] && { stage "done (dry run)"; exit 0; }
stage "done; logs and tables in $OUT, everything printed above in $SUMMARY"
