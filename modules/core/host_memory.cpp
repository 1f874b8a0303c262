#include "core/host_memory.h"

#include <malloc.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>
#include <system_error>

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

namespace {

/// The limit a cgroup file holds [bytes], or none ("max", an unreadable or malformed file).
std::optional<std::int64_t> read_limit(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  std::int64_t bytes = 0;
  const char* end = word.data() + word.size();
  const auto [last, error] = std::from_chars(word.data(), end, bytes);
  if (error != std::errc() || last != end || bytes <= 0) return std::nullopt;
  return bytes;
}

/// Lowers `limit` to the least `file_name` holds in dir/path and each of its ancestors up to dir.
void apply_limits(const std::filesystem::path& dir, const std::string& path, const char* file_name,
                  HostMemoryLimit& limit) {
  std::filesystem::path relative = std::filesystem::path(path).relative_path();
  for (;;) {
    const std::filesystem::path file = dir / relative / file_name;
    if (const std::optional<std::int64_t> bytes = read_limit(file); bytes && *bytes < limit.bytes) {
      limit = {*bytes, file.string()};
    }
    if (relative.empty()) return;
    relative = relative.parent_path();
  }
}

}  // namespace

HostMemoryLimit host_memory_limit(const std::string& proc_self_cgroup, const std::filesystem::path& root,
                                  std::int64_t physical_bytes) {
  HostMemoryLimit limit{physical_bytes, "physical memory"};
  std::istringstream lines(proc_self_cgroup);
  for (std::string line; std::getline(lines, line);) {
    const std::size_t first = line.find(':');
    const std::size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = "," + line.substr(first + 1, second - first - 1) + ",";
    const std::string path = line.substr(second + 1);
    std::error_code ignored;
    if (line.compare(0, first, "0") == 0 && controllers == ",,") {  // v2: the unified hierarchy
      const bool unified_here = std::filesystem::exists(root / "cgroup.controllers", ignored);
      apply_limits(unified_here ? root : root / "unified", path, "memory.max", limit);
    } else if (controllers.find(",memory,") != std::string::npos) {
      apply_limits(root / "memory", path, "memory.limit_in_bytes", limit);
    }
  }
  return limit;
}

HostMemoryLimit host_memory_limit() {
  std::ifstream in("/proc/self/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  const auto physical = static_cast<std::int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  return host_memory_limit(text.str(), "/sys/fs/cgroup", physical);
}

}  // namespace mgbench::host_memory
