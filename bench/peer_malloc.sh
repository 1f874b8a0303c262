# Sourced by the bench/compare_*.sh scripts: the malloc of the best-tuned Python peer, the headline
# of a comparison. PyTorch's CPU performance tuning guide preloads TCMalloc; measured, the Python
# peers gain 11-14 % from it (docs/benchmarks.md, "The host allocator"), more than mgbench does.
#   peer_malloc_env MGBENCH   prints the NAME=VALUE words to export: the TCMalloc that MGBENCH links,
#                             else the system's (ldconfig), preloaded at release rate 0 (as mgbench's
#                             --malloc-reuse sets it); without one, glibc's thresholds of
#                             core/host_memory.h (mmap 32 MiB, trim 2^31 - 1) through GLIBC_TUNABLES.
peer_malloc_env() {
  local lib
  lib=$(ldd "$1" | awk '/libtcmalloc/ {print $3; exit}')
  [[ -n $lib ]] || lib=$(ldconfig -p | awk '/libtcmalloc_minimal\.so\.4 / {print $NF; exit}')
  if [[ -n $lib ]]; then
    echo "LD_PRELOAD=$lib TCMALLOC_RELEASE_RATE=0"
  else
    echo "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=2147483647"
  fi
}
