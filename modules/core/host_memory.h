#pragma once
// How the process's malloc treats memory that a training step frees.
//
// A step allocates and frees the same tensors every time (activations, gradients, workspaces of
// 0.1-30 MiB on the CPU). With glibc's defaults, a freed block above the mmap threshold goes back
// to the kernel (munmap), and so does the top of the heap above the trim threshold (brk): the next
// step's allocation then faults in fresh, zeroed pages. Measured on MobileNetV2 at 64 px, one CPU
// rank: a quarter of the process's time in the kernel's page-fault path, and 1.3x the img/s with
// the memory kept for reuse (docs/benchmarks.md). PyTorch's CPU allocator is plain posix_memalign
// and leaves this to malloc; PyTorch's CPU tuning guide recommends jemalloc or TCMalloc for it.
// On glibc, mgbench gives LibTorch a CPU allocator whose freed blocks glibc's heap can reuse at all
// (runtime/cpu_allocator.h: its posix_memalign does not).
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace mgbench::host_memory {

/// The malloc the process runs on.
struct Allocator {
  std::string name;     // "tcmalloc", "jemalloc", "glibc", or the file name of another
  std::string version;  // "gperftools 2.10", "glibc 2.36"; "" where the library does not say
  std::string library;  // the shared object defining the process's malloc
  bool glibc() const { return name == "glibc"; }
  /// "tcmalloc (gperftools 2.10, /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4)": the run's
  /// `host_malloc` attribute.
  std::string describe() const;
};

/// The allocator the process's `malloc` symbol resolves to (dladdr of dlsym(RTLD_DEFAULT, "malloc")):
/// TCMalloc where the mgbench executable links it (cmake/Dependencies.cmake, MGBENCH_MALLOC) or
/// LD_PRELOAD loads it, jemalloc where preloaded, else glibc's. Does not throw.
Allocator process_allocator();

/// Largest mmap threshold glibc accepts on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX) [bytes]:
/// blocks below it come from the heap and are reused, larger ones (model weights) are mmapped.
inline constexpr long kMmapThresholdBytes = 32L * 1024 * 1024;

/// Keeps freed memory in the process for reuse. TCMalloc: the free pages the set-up left are
/// released, then its release rate is set to 0 (MallocExtension::ReleaseFreeMemory,
/// SetMemoryReleaseRate; at its default rate a MobileNetV2 step at 64 px faulted ~320 pages in
/// again). glibc: its mmap threshold to kMmapThresholdBytes and the heap's trim threshold to 2 GiB
/// (mallopt M_MMAP_THRESHOLD, M_TRIM_THRESHOLD). The cost: the resident memory stays at its peak
/// instead of shrinking between steps (it does not raise the peak itself). Another allocator
/// (jemalloc preloaded), or a user's GLIBC_TUNABLES naming a glibc.malloc setting, is left alone.
/// Returns one line for the log: what was set, or why nothing was. Does not throw.
std::string keep_freed_memory_for_reuse();

/// The host memory a process may use, and what sets it.
struct HostMemoryLimit {
  std::int64_t bytes = 0;
  std::string source;  // "physical memory", or the cgroup file whose limit is the least
};

/// The least of physical_bytes and the memory limits of the process's cgroups and their ancestors:
/// cgroup v2's memory.max, v1's memory.limit_in_bytes (what SLURM's task/cgroup plugin with
/// ConstrainRAMSpace, a container or systemd sets; "max" and v1's page-rounded INT64_MAX mean none).
/// proc_self_cgroup: /proc/self/cgroup's text ("<id>:<controllers>:<path>" lines; "0::<path>" is
/// v2's); root: where the cgroup file systems are mounted (v2 there or under "unified", v1's memory
/// controller under "memory"). A path whose directory is missing (another cgroup namespace's view)
/// contributes the ancestors that exist. Unreadable or malformed files are skipped. Does not throw.
HostMemoryLimit host_memory_limit(const std::string& proc_self_cgroup, const std::filesystem::path& root,
                                  std::int64_t physical_bytes);
/// This process's: /proc/self/cgroup, /sys/fs/cgroup, the machine's physical memory.
HostMemoryLimit host_memory_limit();

/// A memory line of /proc/<pid>/status, "<field>:\t<n> kB", in bytes: status_text is the file's text.
/// Throws std::runtime_error naming the line when it is malformed, or the field when it is missing.
std::int64_t status_bytes(const std::string& status_text, std::string_view field);
/// This process's (/proc/self/status): VmRSS, the resident memory now; VmHWM, its peak.
std::int64_t status_bytes(std::string_view field);

/// This process's peak resident memory since it started its program [bytes]: status_bytes("VmHWM").
/// Not getrusage's ru_maxrss: Linux carries into it the peak of the image that exec replaced -- a
/// fork of the launcher -- so a rank started from a Python process holding 2.4 GB read a peak of
/// 2.4 GB whatever it used. Throws std::runtime_error where /proc has no VmHWM line.
std::int64_t peak_resident_bytes();

/// The minor page faults this process has taken since it started, all its threads (getrusage's
/// RUSAGE_SELF ru_minflt): each one the kernel mapping a page at its first touch -- what memory
/// returned to the kernel and allocated again costs (keep_freed_memory_for_reuse). Read two and
/// subtract (the count goes back beyond exec). Does not throw.
std::int64_t minor_page_faults();

}  // namespace mgbench::host_memory
