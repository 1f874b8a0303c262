#pragma once
// The members of a tar archive (POSIX ustar, pax and GNU long-name headers, as Python's tarfile and
// the webdataset package write them), listed without reading their data: where each regular
// file's bytes are, for random access into webdataset shards. Torch-free (a fuzz target).
//
// Not read: sparse files, multi-volume archives, compressed archives (.tar.gz: webdataset shards
// are plain tar); links and directories are skipped. pax records other than `path` and `size` are
// ignored, as are global pax headers.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mgbench::data {

struct TarMember {
  std::string name;         // its path in the archive
  std::int64_t offset = 0;  // of its data in the archive [bytes]
  std::int64_t size = 0;    // of its data [bytes]
};

/// Reads `out.size()` bytes at `offset` of the archive; returns the bytes read (fewer: the end).
using TarRead = std::function<std::size_t(std::int64_t offset, std::span<std::uint8_t> out)>;

/// The regular files of an archive of `archive_bytes` bytes read through read, in archive order.
/// Throws DataError naming `name` and the header's offset for a header whose checksum is wrong, a
/// size field that is not a number, a member that runs past the end of the archive, a header cut
/// off by the end, or an archive without its end-of-archive (zero) block: cut short at a member's
/// boundary, where Python's tarfile and webdataset read on silently with the members before it.
std::vector<TarMember> list_tar_members(const TarRead& read, std::int64_t archive_bytes, std::string_view name);

/// list_tar_members of the file at path. Throws DataError naming it when it cannot be read.
std::vector<TarMember> list_tar_file(const std::string& path);

}  // namespace mgbench::data
