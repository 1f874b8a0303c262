#include "core/host_memory.h"

#include <malloc.h>

#include <cstdlib>
#include <limits>
#include <string_view>

#include <fmt/format.h>

namespace mgbench::host_memory {
namespace {

std::string_view env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string_view{} : std::string_view{value};
}

/// Why malloc is left as the user set it (GLIBC_TUNABLES naming a glibc.malloc setting, another
/// allocator preloaded), or empty.
std::string users_allocator() {
  if (const std::string_view tunables = env("GLIBC_TUNABLES");
      tunables.find("glibc.malloc.") != std::string_view::npos) {
    return fmt::format("host memory: glibc malloc as GLIBC_TUNABLES sets it ({})", tunables);
  }
  if (const std::string_view preload = env("LD_PRELOAD");
      preload.find("jemalloc") != std::string_view::npos || preload.find("tcmalloc") != std::string_view::npos) {
    return fmt::format("host memory: the allocator LD_PRELOAD loads ({})", preload);
  }
  return {};
}

}  // namespace

std::string map_large_blocks_while_loading() {
  if (std::string line = users_allocator(); !line.empty()) return line;
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(kLoadingMmapThresholdBytes)) != 1) {
    return "host memory: glibc refused mallopt (mmap threshold while loading): its defaults apply";
  }
  return fmt::format("host memory: blocks of {} MiB and more mmapped while the run sets up",
                     kLoadingMmapThresholdBytes >> 20);
}

std::string keep_freed_memory_for_reuse() {
  if (std::string line = users_allocator(); !line.empty()) return line;
  // Setting either disables glibc's dynamic thresholds; the trim threshold alone would leave the
  // mmap threshold at its 128 KiB start (measured: half the img/s), so both are set.
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThresholdBytes)) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max()) == 1;
  if (!mmap_set || !trim_set) {
    return fmt::format("host memory: glibc refused mallopt (mmap threshold {}, trim threshold {}): its defaults apply",
                       mmap_set ? "set" : "refused", trim_set ? "set" : "refused");
  }
  return fmt::format(
      "host memory: freed memory kept for reuse (glibc malloc: mmap threshold {} MiB, heap trimmed only above 2 GiB "
      "free)",
      kMmapThresholdBytes >> 20);
}

}  // namespace mgbench::host_memory
