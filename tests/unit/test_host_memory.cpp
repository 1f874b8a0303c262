// host_memory::host_memory_limit against cgroup trees laid out as the kernel mounts them: v1's
// memory controller, v2 alone and v2 beside v1 (systemd's hybrid layout).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/host_memory.h"

namespace mgbench {
namespace {

namespace fs = std::filesystem;
constexpr std::int64_t kPhysical = std::int64_t{24} << 30;

class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("mgbench-cgroup-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  /// Writes `text` to root/relative, making its directories.
  void write(const std::string& relative, const std::string& text) {
    fs::create_directories((root_ / relative).parent_path());
    std::ofstream(root_ / relative) << text;
  }
  host_memory::HostMemoryLimit limit(const std::string& proc_self_cgroup) {
    return host_memory::host_memory_limit(proc_self_cgroup, root_, kPhysical);
  }
  fs::path root_;
};

TEST_F(CgroupTree, V1TheLeastOfTheCgroupAndItsAncestors) {
  // SLURM's task/cgroup: job, step and task cgroups; the job's limit is the least here.
  write("memory/memory.limit_in_bytes", "9223372036854771712\n");  // the root: none
  write("memory/slurm/uid_0/job_7/memory.limit_in_bytes", "4294967296\n");
  write("memory/slurm/uid_0/job_7/step_0/memory.limit_in_bytes", "8589934592\n");
  write("memory/slurm/uid_0/job_7/step_0/task_1/memory.limit_in_bytes", "9223372036854771712\n");
  const auto l = limit("12:cpuset:/slurm/uid_0/job_7/step_0\n4:cpu,memory:/slurm/uid_0/job_7/step_0/task_1\n");
  EXPECT_EQ(l.bytes, std::int64_t{4} << 30);
  EXPECT_EQ(l.source, (root_ / "memory/slurm/uid_0/job_7/memory.limit_in_bytes").string());
}

TEST_F(CgroupTree, V2MemoryMaxWhereTheUnifiedHierarchyIsMounted) {
  write("cgroup.controllers", "cpu memory pids\n");
  write("user.slice/memory.max", "max\n");
  write("user.slice/job.scope/memory.max", "1073741824\n");
  const auto l = limit("0::/user.slice/job.scope\n");
  EXPECT_EQ(l.bytes, std::int64_t{1} << 30);
  EXPECT_EQ(l.source, (root_ / "user.slice/job.scope/memory.max").string());
}

TEST_F(CgroupTree, V2BesideV1IsUnderUnified) {
  write("unified/app/memory.max", "2147483648\n");
  write("memory/app/memory.limit_in_bytes", "3221225472\n");
  const auto l = limit("0::/app\n9:memory:/app\n");
  EXPECT_EQ(l.bytes, std::int64_t{2} << 30);
  EXPECT_EQ(l.source, (root_ / "unified/app/memory.max").string());
}

TEST_F(CgroupTree, NoLimitMissingDirectoriesAndMalformedFilesLeavePhysicalMemory) {
  write("memory/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "none"
  write("memory/a/memory.limit_in_bytes", "12k\n");                // malformed: skipped
  write("memory/a/b/memory.limit_in_bytes", "0\n");                // malformed: skipped
  // /proc/self/cgroup names a path this mount does not have (another cgroup namespace's view):
  // the ancestors that exist count.
  EXPECT_EQ(limit("4:memory:/a/b/c/d\n").bytes, kPhysical);
  EXPECT_EQ(limit("4:memory:/a/b/c/d\n").source, "physical memory");
  EXPECT_EQ(limit("").source, "physical memory");
  EXPECT_EQ(limit("garbage without colons\n1:name=systemd:/\n").bytes, kPhysical);
  write("memory/a/memory.limit_in_bytes", "1048576\n");
  EXPECT_EQ(limit("4:memory:/a/b/c/d\n").bytes, 1048576);
  // A limit above the physical memory does not raise it.
  write("memory/a/memory.limit_in_bytes", "99999999999999\n");
  EXPECT_EQ(limit("4:memory:/a\n").bytes, kPhysical);
}

TEST(HostMemoryLimit, ThisProcessHasOneAtMostItsPhysicalMemory) {
  const auto l = host_memory::host_memory_limit();
  EXPECT_GT(l.bytes, 0);
  EXPECT_FALSE(l.source.empty());
}

TEST(PeakResidentBytes, ReadsVmHwmInKilobytesAndNamesAMalformedLine) {
  EXPECT_EQ(host_memory::peak_resident_bytes("Name:\tmgbench\nVmPeak:\t 900 kB\nVmHWM:\t    2048 kB\nVmRSS:\t 1 kB\n"),
            2048 * 1024);
  EXPECT_THROW(
      {
        try {
          host_memory::peak_resident_bytes("VmHWM:\t2048 MB\n");
        } catch (const std::runtime_error& e) {
          EXPECT_NE(std::string(e.what()).find("VmHWM:\t2048 MB"), std::string::npos) << e.what();
          throw;
        }
      },
      std::runtime_error);
  EXPECT_THROW(host_memory::peak_resident_bytes("Name:\tx\nVmRSS:\t1 kB\n"), std::runtime_error);
}

/// This process's resident memory now (/proc/self/status's VmRSS) [bytes].
std::int64_t resident_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  ADD_FAILURE() << "no VmRSS in /proc/self/status";
  return 0;
}

TEST(PeakResidentBytes, ThisProcessPeakHoldsWhatItTouches) {
  // Against the resident memory before, not the peak: an earlier test may have peaked higher.
  const std::int64_t resident_before = resident_bytes();
  constexpr std::size_t kBytes = 256u << 20;
  std::vector<char> touched(kBytes, 1);  // every page written
  const std::int64_t resident_after = resident_bytes();
  const std::int64_t peak = host_memory::peak_resident_bytes();  // read after: reading touches pages too
  EXPECT_GE(peak, resident_before + static_cast<std::int64_t>(kBytes)) << resident_before;
  EXPECT_GE(peak, resident_after);
  EXPECT_EQ(touched[kBytes - 1], 1);
}

}  // namespace
}  // namespace mgbench
