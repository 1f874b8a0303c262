#include "core/durable.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace mgbench {

void sync_to_disk(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  int error = fd < 0 ? errno : 0;
  if (fd >= 0) {
    if (::fsync(fd) != 0) error = errno;
    ::close(fd);
  }
  MGBENCH_REQUIRE(error == 0, DataError, "fsync of '{}' failed ({})", path, std::strerror(error));
}

namespace {

// nftw(3) takes a plain function: the walk's count and first failure live here, one walk at a time
// per thread.
thread_local std::uintmax_t removed_entries = 0;
thread_local int remove_error = 0;
thread_local std::string remove_failed_at;

int remove_entry(const char* entry, const struct stat* /*status*/, int /*type*/, struct FTW* /*walk*/) {
  if (std::remove(entry) != 0 && errno != ENOENT) {
    remove_error = errno;
    remove_failed_at = entry;
    return 1;  // stops the walk
  }
  ++removed_entries;
  return 0;
}

}  // namespace

std::uintmax_t remove_tree(const std::string& path) {
  struct stat status {};
  if (::lstat(path.c_str(), &status) != 0) {
    MGBENCH_REQUIRE(errno == ENOENT, DataError, "cannot remove '{}' ({})", path, std::strerror(errno));
    return 0;
  }
  removed_entries = 0;
  remove_error = 0;
  remove_failed_at.clear();
  // Depth first (a directory after its entries), never following a link, within the file system.
  constexpr int kOpenDescriptors = 32;
  const int walked = ::nftw(path.c_str(), remove_entry, kOpenDescriptors, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
  if (walked != 0 && remove_error == 0) {
    remove_error = errno;
    remove_failed_at = path;
  }
  MGBENCH_REQUIRE(remove_error == 0, DataError, "cannot remove '{}' ({})", remove_failed_at,
                  std::strerror(remove_error));
  return removed_entries;
}

std::string make_writable_directory(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return ec.message();
  if (!std::filesystem::is_directory(path, ec)) return ec ? ec.message() : "not a directory";
  return ::access(path.c_str(), W_OK) == 0 ? "" : std::strerror(errno);
}

}  // namespace mgbench
