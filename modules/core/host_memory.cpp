#include "core/host_memory.h"

#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <system_error>

#include <fmt/format.h>
#if MGBENCH_HAVE_TCMALLOC
#include <gperftools/malloc_extension.h>
#endif

namespace mgbench::host_memory {
namespace {

#if MGBENCH_HAVE_TCMALLOC
/// TCMalloc's MallocExtension where TCMalloc is the process's malloc, else null. Found at run time:
/// core is linked into binaries without TCMalloc too (the tests'), and a preloaded one counts.
MallocExtension* tcmalloc_extension() {
  if (process_allocator().name != "tcmalloc") return nullptr;
  using Instance = MallocExtension* (*)();
  auto* instance = reinterpret_cast<Instance>(dlsym(RTLD_DEFAULT, "_ZN15MallocExtension8instanceEv"));
  return instance == nullptr ? nullptr : instance();
}
#endif

/// The whole text of a file ("" where it cannot be read).
std::string read_text(const char* path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string_view env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string_view{} : std::string_view{value};
}

/// Why glibc's malloc settings are left alone (another allocator; GLIBC_TUNABLES naming a
/// glibc.malloc setting), or empty.
std::string left_alone() {
  if (const Allocator a = process_allocator(); !a.glibc()) {
    return fmt::format("host memory: malloc is {}: mgbench leaves it as it is", a.describe());
  }
  if (const std::string_view tunables = env("GLIBC_TUNABLES");
      tunables.find("glibc.malloc.") != std::string_view::npos) {
    return fmt::format("host memory: glibc malloc as GLIBC_TUNABLES sets it ({})", tunables);
  }
  return {};
}

}  // namespace

std::string Allocator::describe() const {
  return version.empty() ? fmt::format("{} ({})", name, library) : fmt::format("{} ({}, {})", name, version, library);
}

Allocator process_allocator() {
  Allocator a{"glibc", fmt::format("glibc {}", gnu_get_libc_version()), "libc.so.6"};
  Dl_info info{};
  void* malloc_symbol = dlsym(RTLD_DEFAULT, "malloc");
  if (malloc_symbol == nullptr || dladdr(malloc_symbol, &info) == 0 || info.dli_fname == nullptr) return a;
  const std::string library = info.dli_fname;
  const std::string file = std::filesystem::path(library).filename().string();
  if (file.rfind("libc.so", 0) == 0) {
    a.library = library;
    return a;
  }
  a = {file, "", library};
  if (file.find("tcmalloc") != std::string::npos) {
    a.name = "tcmalloc";
    using TcVersion = const char* (*)(int*, int*, const char**);
    if (auto* tc_version = reinterpret_cast<TcVersion>(dlsym(RTLD_DEFAULT, "tc_version"))) {
      int major = 0, minor = 0;
      const char* patch = nullptr;
      a.version = tc_version(&major, &minor, &patch);
    }
  } else if (file.find("jemalloc") != std::string::npos) {
    a.name = "jemalloc";
  }
  return a;
}

std::string keep_freed_memory_for_reuse() {
#if MGBENCH_HAVE_TCMALLOC
  if (MallocExtension* tcmalloc = tcmalloc_extension()) {
    tcmalloc->ReleaseFreeMemory();      // what the set-up freed goes back first: a rank's budget is its resident memory
    tcmalloc->SetMemoryReleaseRate(0);  // then nothing more: each step reuses the last one's pages
    return fmt::format(
        "host memory: freed memory kept for reuse ({}: the set-up's free pages released, then "
        "release rate 0)",
        process_allocator().describe());
  }
#endif
  if (std::string line = left_alone(); !line.empty()) return line;
  // Setting either disables glibc's dynamic thresholds; the trim threshold alone would leave the
  // mmap threshold at its 128 KiB start (measured: half the img/s), so both are set.
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThresholdBytes)) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max()) == 1;
  if (!mmap_set || !trim_set) {
    return fmt::format("host memory: glibc refused mallopt (mmap threshold {}, trim threshold {}): its defaults apply",
                       mmap_set ? "set" : "refused", trim_set ? "set" : "refused");
  }
  return fmt::format(
      "host memory: freed memory kept for reuse ({}: mmap threshold {} MiB, heap trimmed only above 2 GiB free)",
      process_allocator().describe(), kMmapThresholdBytes >> 20);
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
  const auto physical = static_cast<std::int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  return host_memory_limit(read_text("/proc/self/cgroup"), "/sys/fs/cgroup", physical);
}

std::int64_t status_bytes(const std::string& status_text, std::string_view field) {
  const std::string label = std::string(field) + ":";
  std::istringstream lines(status_text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(label, 0) != 0) continue;
    std::istringstream fields(line.substr(label.size()));
    std::int64_t kib = -1;
    std::string unit;
    if (fields >> kib >> unit && kib >= 0 && unit == "kB") return kib * 1024;
    throw std::runtime_error(fmt::format("/proc/self/status: expected \"{} <n> kB\", read \"{}\"", label, line));
  }
  throw std::runtime_error(
      fmt::format("/proc/self/status: no {} line (a kernel without /proc's memory counters)", field));
}

std::int64_t status_bytes(std::string_view field) { return status_bytes(read_text("/proc/self/status"), field); }

std::int64_t peak_resident_bytes() { return status_bytes("VmHWM"); }

std::int64_t minor_page_faults() {
  rusage usage{};
  return getrusage(RUSAGE_SELF, &usage) == 0 ? static_cast<std::int64_t>(usage.ru_minflt) : 0;
}

}  // namespace mgbench::host_memory
