#!/usr/bin/env bash
# Downloads the Debian packages that scripts/gpu-check.sh unpacks on a GPU machine that has CUDA,
# PyTorch, a compiler, CMake and ninja but no MPI, HDF5 or Boost, and no network (this
# workplace's H100/H200 machines). Run it on a Debian 12 machine with network, then carry
# .gpu-deps/ (git-ignored, ~37-51 MB) to the GPU machine beside the checkout.
#   scripts/fetch-gpu-deps.sh [DIR]      (default DIR: .gpu-deps)
#   GPU_HAS="torchvision pillow" scripts/fetch-gpu-deps.sh   # this workplace's H100/H200 image has both:
#                                        # their wheels (14.7 MB) are not fetched, and the carry stays small
# The list: Open MPI 4.1 and its runtime libraries, parallel HDF5 1.10, Boost.Program_options,
# spdlog/fmt, nlohmann-json, GoogleTest, Google Benchmark, zlib headers, PCRE2, libcsv, TurboJPEG, libspng. Base libraries a CUDA
# image always has (libc, libstdc++, libgcc, zlib, OpenSSL, libcurl's TLS stack) are left out on
# purpose: Debian's copies must not shadow the machine's own.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpu-deps}
PACKAGES=(
  openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev
  libpmix2 libhwloc15 libevent-2.1-7 libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0
  libibverbs1 librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200 libnl-route-3-200 libmunge2 libnuma1 libltdl7
  libhdf5-openmpi-103-1 libhdf5-openmpi-dev libaec0 libsz2
  libboost-program-options1.74.0 libboost-program-options1.74-dev libboost1.74-dev
  libspdlog1.10 libspdlog-dev libfmt9 libfmt-dev nlohmann-json3-dev
  libgtest-dev libbenchmark1debian libbenchmark-dev zlib1g-dev libpcre2-dev libpcre2-8-0 libcsv-dev libcsv3
  libturbojpeg0 libturbojpeg0-dev libspng0 libspng-dev
)
# HDF5's libcurl and what it needs that a CUDA image may lack (seen on an H200 machine: libssh2,
# OpenLDAP 2.5): gpu-check.sh takes from these only the libraries whose soname the machine lacks.
SYSTEM_FIRST=(libcurl4 libssh2-1 libldap-2.5-0 libsasl2-2 libsasl2-modules-db)
# eu-stack (elfutils): gpu-check.sh prints the threads of a GPU test that outlives its time (a hang
# is seen, not guessed at); unpacked apart, used by nothing else.
TOOLS=(elfutils libdw1 libelf1 libasm1)
command -v apt-get >/dev/null || { echo "fetch-gpu-deps.sh: needs apt-get (Debian 12)" >&2; exit 1; }
mkdir -p "$DIR"
(cd "$DIR" && apt-get download "${PACKAGES[@]}")
mkdir -p "$DIR/system-first"
(cd "$DIR/system-first" && apt-get download "${SYSTEM_FIRST[@]}")
mkdir -p "$DIR/tools"
(cd "$DIR/tools" && apt-get download "${TOOLS[@]}")
# The Python peers' torchvision (matching the GPU machine's torch 2.11) and Pillow, for a GPU
# machine whose Python lacks them: gpu-check.sh installs into $PREFIX only what fails to import.
# GPU_PYTHON_VERSION: that machine's python3 (3.12 on this workplace's H100/H200 machines).
PIP=${PIP:-$(command -v pip3 || echo "${MGBENCH_VENV:-$HOME/.cache/mgbench/venv}/bin/pip")}
mkdir -p "$DIR/wheels"
PEER_WHEELS=()
for wheel in torchvision==0.26.0 pillow; do
  [[ " ${GPU_HAS:-} " == *" ${wheel%%==*} "* ]] || PEER_WHEELS+=("$wheel")
done
((${#PEER_WHEELS[@]} == 0)) ||
  "$PIP" download -q --no-deps --only-binary=:all: --python-version "${GPU_PYTHON_VERSION:-3.12}" \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$DIR/wheels" "${PEER_WHEELS[@]}"
# TorchTune 0.6.1 and what its recipes import that the GPU machine's Python lacks (the torchtune set's peer,
# bench/peer_torchtune.py): unpacked by gpu-check.sh into a folder of its own (pyarrow and xxhash are there).
mkdir -p "$DIR/wheels/torchtune-site"
"$PIP" download -q --no-deps --only-binary=:all: --python-version "${GPU_PYTHON_VERSION:-3.12}" \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$DIR/wheels/torchtune-site" torchtune==0.6.1 torchao==0.11.0 omegaconf==2.3.0 torchdata==0.11.0 datasets==3.6.0 \
  dill==0.3.8 multiprocess==0.70.16
# omegaconf's parser runtime exists only as a source archive (pure Python: its src/antlr4 is the package).
"$PIP" download -q --no-deps --no-binary=:all: -d "$DIR/wheels/torchtune-site" antlr4-python3-runtime==4.9.3
# nvJPEG's header and library (--decode device) for a machine whose CUDA toolkit and torch lack them.
"$PIP" download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 -d "$DIR/wheels" \
  nvidia-nvjpeg==13.3.2.43
echo "fetch-gpu-deps.sh: $(ls "$DIR"/*.deb | wc -l) packages, $(du -sh "$DIR" | cut -f1) in $DIR"
