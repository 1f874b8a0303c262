#include "results/write_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include <fmt/format.h>

namespace mgbench::results {
namespace {

std::mutex& writers_mutex() {
  static std::mutex m;
  return m;
}
std::multiset<std::string>& writers() {
  static std::multiset<std::string> paths;
  return paths;
}
std::string canonical_or_same(const std::string& path) {
  std::error_code ignored;
  const auto canonical = std::filesystem::weakly_canonical(path, ignored);
  return canonical.empty() ? path : canonical.string();
}

}  // namespace

std::string lock_for_writing(const std::string& path, int& fd, bool& created) {
  const std::string lock_path = path + ".lock";
  // A lock taken on a lock file that its job removed meanwhile (remove_lock_file: opened before the
  // removal, locked after its release) guards nothing: the path then names another file, or none.
  // Taken again on the file the path names now (the usual remedy, as flock(1)-style tools do).
  for (int attempt = 0;; ++attempt) {
    fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    created = fd >= 0;
    if (fd < 0 && errno == EEXIST) fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return fmt::format("cannot create the lock file '{}' of results file '{}' ({})", lock_path, path,
                         std::strerror(errno));
    }
    struct flock lock {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    if (fcntl(fd, F_SETLK, &lock) != 0) break;
    struct stat held {
    }, named{};
    if (attempt < 8 && (::fstat(fd, &held) != 0 || ::stat(lock_path.c_str(), &named) != 0 ||
                        held.st_dev != named.st_dev || held.st_ino != named.st_ino)) {
      ::close(fd);
      continue;
    }
    return "";
  }
  const int error = errno;
  std::string holder = "another process";
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  if (fcntl(fd, F_GETLK, &probe) == 0 && probe.l_type != F_UNLCK) holder = fmt::format("process {}", probe.l_pid);
  ::close(fd);
  fd = -1;
  if (error == EACCES || error == EAGAIN) {
    return fmt::format(
        "results file '{}' is being written by another job ({} holds '{}'); one HDF5 file takes one "
        "writing job at a time: give each job its own --results (the slurm/ scripts use "
        "outputs/<job id>/results.h5) and analyse them together with mgbench report",
        path, holder, lock_path);
  }
  return fmt::format(
      "cannot lock '{}' ({}): POSIX locks unavailable on this file system? (Lustre: mount with "
      "-o flock)",
      lock_path, std::strerror(error));
}

void remove_lock_file(const std::string& path) noexcept {
  ::unlink((path + ".lock").c_str());  // while holding it: a job that opened it meanwhile takes it again
}

bool being_written(const std::string& path) {
  {
    std::lock_guard<std::mutex> lock(writers_mutex());
    if (writers().contains(canonical_or_same(path))) return true;
  }
  const int fd = ::open((path + ".lock").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // no lock file: no writer since it was made
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  const bool held = fcntl(fd, F_GETLK, &probe) == 0 && probe.l_type != F_UNLCK;
  ::close(fd);
  return held;
}

void register_writer(const std::string& path) {
  std::lock_guard<std::mutex> lock(writers_mutex());
  writers().insert(canonical_or_same(path));
}

void unregister_writer(const std::string& path) noexcept {
  try {
    std::lock_guard<std::mutex> lock(writers_mutex());
    const auto it = writers().find(canonical_or_same(path));
    if (it != writers().end()) writers().erase(it);
  } catch (...) {
  }
}

}  // namespace mgbench::results
