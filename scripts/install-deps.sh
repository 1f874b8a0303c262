#!/usr/bin/env bash
# Installs what mgbench needs on a Debian/Ubuntu workstation, skipping what is already there:
#   - Debian packages: compilers, CMake, Ninja, ccache, Open MPI, HDF5 built with Open MPI,
#     Boost.Program_options, zlib, spdlog/fmt, nlohmann-json, GoogleTest, Google Benchmark, TurboJPEG, libspng,
#     TCMalloc (gperftools' tcmalloc_minimal: the executable's malloc with cmake's MGBENCH_MALLOC=tcmalloc),
#     clang-format (the style check), clang (libFuzzer: scripts/fuzz.sh), slurm-wlm and munge (a one-node SLURM for the slurm-labelled tests; no daemon is started here),
#     chromium (headless: the browser-labelled test of mgbench-plot's HTML page);
#   - a Python virtual environment with the PyPI torch wheel pinned to 2.11.0 (its LibTorch is
#     what mgbench links), torchvision (test oracle, benchmark peer), h5py, numpy, pytest, and the
#     analysis package python/ (mgbench_analysis, mgbench-plot; with pandas and matplotlib), and
#     lizard (scripts/check-shape.sh: function lengths).
# The venv lives outside the checkout so clean clones reuse it:
#   MGBENCH_VENV (default ~/.cache/mgbench/venv).
# Clusters use environment modules instead: see Makefile.hpc.
set -euo pipefail

MGBENCH_VENV=${MGBENCH_VENV:-$HOME/.cache/mgbench/venv}
TORCH_VERSION=2.11.0
TORCHVISION_VERSION=0.26.0
APT_PACKAGES=(g++ cmake ninja-build ccache pkg-config python3-venv
  openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools
  libboost-program-options-dev zlib1g-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libgtest-dev libbenchmark-dev libpcre2-dev libcsv-dev clang-format
  libturbojpeg0-dev libspng-dev  # image decoding on the host (JPEG, PNG): the imagefolder / webdataset datasets
  libgoogle-perftools-dev  # TCMalloc: the executable's malloc in a build with MGBENCH_MALLOC=tcmalloc
  clang            # libFuzzer and the sanitizers: the fuzz targets of tests/fuzz (label fuzz)
  slurm-wlm munge  # slurm-wlm, munge: the test SLURM of tests/slurm (label slurm)
  lmod             # the environment modules an install tree is loaded with (tests/python/test_install.py)
  chromium)        # headless, for the HTML page of mgbench-plot (label browser)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing Debian packages: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY="$MGBENCH_VENV/bin/python"
# Test oracles: tiktoken (tokenizer), transformers + safetensors (Llama), peft (LoRA), webdataset (tar shards).
ORACLES=("tiktoken==0.12.0" "transformers==5.23.0" "safetensors==0.8.0" "peft==0.21.2" "webdataset==1.0.2")
if ! "$PY" -c "import torch, torchvision, h5py, numpy, pytest, sys; sys.exit(not torch.__version__.startswith('$TORCH_VERSION'))" 2>/dev/null; then
  echo "install-deps: creating $MGBENCH_VENV with torch==$TORCH_VERSION (a large download, once)"
  python3 -m venv "$MGBENCH_VENV"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" h5py numpy pytest
fi
# Test oracles added later than the venv: installed into an existing one too.
"$PY" -c "import tiktoken, transformers, safetensors, peft, webdataset" 2>/dev/null || "$PY" -m pip install -q "${ORACLES[@]}"
# Regression checks as centres run them: ReFrame (reframe/, tests/python/test_reframe.py). Looked for
# as the command the test runs: `import reframe` run from the checkout finds its reframe/ folder (a
# namespace package) and said yes without ReFrame, so py_reframe was SKIPPED on fresh machines.
[[ -x "$MGBENCH_VENV/bin/reframe" ]] || "$PY" -m pip install -q "reframe-hpc==4.10.4"
# Code checks: lizard (function lengths, scripts/check-shape.sh).
"$PY" -c "import lizard" 2>/dev/null || "$PY" -m pip install -q "lizard==1.24.3"
# TorchTune (templates and masks oracle; its single-device recipes as the GPU peer,
# bench/peer_torchtune.py) in a folder of its own, added to sys.path only by what uses it: it needs an
# old torchao (0.11, for nf4tensor) that peft refuses. Without its dependency tree: its message
# transforms, Llama 3 tokenizer and recipes need only these (the recipes' data loader is torchdata's,
# their data sets load through Hugging Face `datasets`, with pyarrow, dill, multiprocess and xxhash).
TORCHTUNE_SITE="$MGBENCH_VENV/torchtune-site"
TORCHTUNE=("torchtune==0.6.1" "torchao==0.11.0" "sentencepiece==0.2.1" "omegaconf==2.3.0" "antlr4-python3-runtime==4.9.3"
  "torchdata==0.11.0" "datasets==3.6.0" "pyarrow==20.0.0" "dill==0.3.8" "multiprocess==0.70.16" "xxhash==3.5.0")
[[ -d "$TORCHTUNE_SITE/torchtune" && -d "$TORCHTUNE_SITE/datasets" ]] ||
  "$PY" -m pip install -q --no-deps --upgrade --target "$TORCHTUNE_SITE" "${TORCHTUNE[@]}"
# nvJPEG beside torch's CUDA libraries (nvidia/cu13, where CUPTI comes from): --decode device builds
# and its CPU-side tests compile here too; only a GPU runs it.
"$PY" -c "import glob, sys, torch; sys.exit(not torch.version.cuda or bool(glob.glob(sys.prefix + '/lib/python3*/site-packages/nvidia/cu13/include/nvjpeg.h')))" 2>/dev/null &&
  "$PY" -m pip install -q --no-deps "nvidia-nvjpeg==13.3.2.43"
# Real photos for the image decoding tests (tests/python/image_oracles.py): scikit-image's data files,
# its wheel unpacked into a folder of its own without its dependencies (the tests only read the files).
SKIMAGE_SITE="$MGBENCH_VENV/skimage-site"
[[ -f "$SKIMAGE_SITE/skimage/data/rocket.jpg" ]] ||
  "$PY" -m pip install -q --no-deps --target "$SKIMAGE_SITE" "scikit-image==0.26.0"
# The analysis package of this checkout (reinstalled when its version differs from the installed one).
ANALYSIS_DIR="$(cd "$(dirname "$0")/.." && pwd)/python"
ANALYSIS_VERSION=$(sed -n 's/^__version__ = "\([^"]*\)".*/\1/p' "$ANALYSIS_DIR/mgbench_analysis/__init__.py")
"$PY" -c "import mgbench_analysis, pandas, matplotlib, sys; sys.exit(mgbench_analysis.__version__ != '$ANALYSIS_VERSION')" \
  2>/dev/null || "$PY" -m pip install -q "$ANALYSIS_DIR"
echo "install-deps: ok (python: $PY, $("$PY" -c 'import torch; print("torch", torch.__version__)'))"
