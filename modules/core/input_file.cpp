#include "core/input_file.h"

#include <sys/stat.h>
#include <zlib.h>

#include <fmt/format.h>

#include "core/error.h"

namespace mgbench {

void require_regular_file(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return;
  const char* kind = S_ISFIFO(st.st_mode)   ? "a FIFO (named pipe)"
                     : S_ISDIR(st.st_mode)  ? "a directory"
                     : S_ISCHR(st.st_mode)  ? "a character device"
                     : S_ISBLK(st.st_mode)  ? "a block device"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "not a file";
  throw DataError(fmt::format(
      "{} '{}': {}, not a regular file; mgbench reads its inputs from regular files only (reading a pipe or device "
      "could block the job forever)",
      what, path, kind));
}

std::size_t gz_read(gzFile_s* file, void* out, unsigned n, const std::string& path, std::string_view what) {
  const int got = gzread(file, out, n);
  int err = Z_OK;
  const char* message = gzerror(file, &err);
  if (got < 0) {
    throw DataError(fmt::format("{} '{}': corrupt gzip data ({})", what, path,
                                message != nullptr ? message : "unknown zlib error"));
  }
  if (got == 0 && err == Z_BUF_ERROR) {
    throw DataError(fmt::format("{} '{}': the gzip stream ends before its trailer ({}): the file is cut short", what,
                                path, message != nullptr ? message : "unexpected end of file"));
  }
  return static_cast<std::size_t>(got);
}

}  // namespace mgbench
