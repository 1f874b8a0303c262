# Sourced by the bench/compare_*.sh scripts: a Python peer on the mgbench executable's malloc, as its
# --malloc-reuse (default on) sets it (docs/design.md, "The host allocator"), so that a comparison's
# headline is like for like.
#   peer_malloc_env MGBENCH   prints the NAME=VALUE words to export: TCMalloc preloaded at release
#                             rate 0 where the executable links it (ldd), else glibc's thresholds of
#                             core/host_memory.h (mmap 32 MiB, trim 2^31 - 1) through GLIBC_TUNABLES.
peer_malloc_env() {
  local lib
  lib=$(ldd "$1" | awk '/libtcmalloc/ {print $3; exit}')
  if [[ -n $lib ]]; then
    echo "LD_PRELOAD=$lib TCMALLOC_RELEASE_RATE=0"
  else
    echo "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=2147483647"
  fi
}
