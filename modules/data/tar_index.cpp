#include "data/tar_index.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace mgbench::data {
namespace {

constexpr std::int64_t kBlock = 512;

std::int64_t round_up(std::int64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

std::string field(const std::uint8_t* header, std::size_t at, std::size_t length) {
  const auto* begin = reinterpret_cast<const char*>(header + at);
  return std::string(begin, strnlen(begin, length));
}

// An octal field (NUL- or space-terminated), or GNU's base-256 (high bit of the first byte set).
bool numeric_field(const std::uint8_t* header, std::size_t at, std::size_t length, std::int64_t& value) {
  value = 0;
  if ((header[at] & 0x80) != 0) {
    for (std::size_t i = 1; i < length; ++i) {
      if (value > (INT64_MAX >> 8)) return false;
      value = (value << 8) | header[at + i];
    }
    return (header[at] & 0x7F) == 0;
  }
  std::size_t i = at;
  while (i < at + length && header[i] == ' ') ++i;
  bool digits = false;
  for (; i < at + length && header[i] >= '0' && header[i] <= '7'; ++i) {
    if (value > (INT64_MAX >> 3)) return false;
    value = value * 8 + (header[i] - '0');
    digits = true;
  }
  return digits && (i == at + length || header[i] == '\0' || header[i] == ' ');
}

bool checksum_matches(const std::uint8_t* header) {
  std::int64_t stored = 0;
  if (!numeric_field(header, 148, 8, stored)) return false;
  std::int64_t sum = 0;
  for (std::int64_t i = 0; i < kBlock; ++i) sum += (i >= 148 && i < 156) ? ' ' : header[i];
  return sum == stored;
}

// The `path` and `size` of a pax extended header's "LEN key=value\n" records.
void parse_pax(const std::string& records, std::string& path, std::int64_t& size, std::string_view name,
               std::int64_t at) {
  std::size_t pos = 0;
  while (pos < records.size()) {
    const std::size_t space = records.find(' ', pos);
    std::size_t length = 0;
    const bool ok = space != std::string::npos && space > pos &&
                    std::all_of(records.begin() + static_cast<std::ptrdiff_t>(pos),
                                records.begin() + static_cast<std::ptrdiff_t>(space),
                                [](unsigned char c) { return std::isdigit(c) != 0; }) &&
                    (length = std::stoul(records.substr(pos, std::min<std::size_t>(space - pos, 12)))) > 0 &&
                    pos + length <= records.size() && records[pos + length - 1] == '\n';
    MGBENCH_REQUIRE(ok, DataError, "{}: a malformed pax header at byte {}", name, at);
    const std::string record = records.substr(space + 1, pos + length - space - 2);
    const std::size_t eq = record.find('=');
    if (eq != std::string::npos) {
      const std::string key = record.substr(0, eq), value = record.substr(eq + 1);
      if (key == "path") path = value;
      if (key == "size") {
        MGBENCH_REQUIRE(
            !value.empty() && value.size() < 19 &&
                std::all_of(value.begin(), value.end(), [](unsigned char c) { return std::isdigit(c) != 0; }),
            DataError, "{}: a pax size '{}' that is not a number at byte {}", name, value, at);
        size = std::stoll(value);
      }
    }
    pos += length;
  }
}

}  // namespace

std::vector<TarMember> list_tar_members(const TarRead& read, std::int64_t archive_bytes, std::string_view name) {
  std::vector<TarMember> members;
  std::array<std::uint8_t, kBlock> header{};
  std::string next_path;        // from a pax 'x' or GNU 'L' header, for the next member
  std::int64_t next_size = -1;  // from a pax 'x' header
  std::int64_t at = 0;
  bool ended = false;  // by the end-of-archive block, as a writer that finished leaves it
  while (at + kBlock <= archive_bytes) {
    MGBENCH_REQUIRE(read(at, header) == header.size(), DataError, "{}: cannot read the header at byte {}", name, at);
    if (std::all_of(header.begin(), header.end(), [](std::uint8_t b) { return b == 0; })) {
      ended = true;
      break;
    }
    MGBENCH_REQUIRE(checksum_matches(header.data()), DataError,
                    "{}: not a tar archive, or corrupt: a header checksum mismatch at byte {}", name, at);
    std::int64_t size = 0;
    MGBENCH_REQUIRE(numeric_field(header.data(), 124, 12, size), DataError,
                    "{}: a member size that is not a number at "
                    "byte {}",
                    name, at);
    const char type = static_cast<char>(header[156]);
    const std::int64_t data_at = at + kBlock;
    if (type == 'x' || type == 'L') {  // the next member's path (and size): pax, or GNU's long name
      MGBENCH_REQUIRE(size <= (1 << 20) && size <= archive_bytes - data_at, DataError,
                      "{}: a {} byte extended header at byte {} (the archive has {})", name, size, at, archive_bytes);
      std::string text(static_cast<std::size_t>(size), '\0');
      MGBENCH_REQUIRE(read(data_at, {reinterpret_cast<std::uint8_t*>(text.data()), text.size()}) == text.size(),
                      DataError, "{}: cannot read the extended header at byte {}", name, at);
      if (type == 'L') {
        next_path = text.substr(0, strnlen(text.c_str(), text.size()));
      } else {
        parse_pax(text, next_path, next_size, name, at);
      }
      at = data_at + round_up(size);
      continue;
    }
    if (next_size >= 0) size = next_size;
    std::string path = next_path;
    if (path.empty()) {
      const std::string prefix = field(header.data(), 345, 155);
      const std::string base = field(header.data(), 0, 100);
      path = prefix.empty() ? base : prefix + "/" + base;
    }
    next_path.clear();
    next_size = -1;
    // Links, devices, directories and FIFOs carry no data whatever their size field says (tarfile's
    // _proc_builtin); regular files and unknown types do.
    const bool regular = type == '0' || type == '\0' || type == '7';
    if (!regular && type >= '1' && type <= '6') size = 0;
    MGBENCH_REQUIRE(size <= archive_bytes - data_at, DataError,  // no overflow: both sides non-negative
                    "{}: '{}' at byte {} holds {} bytes but the archive ends at {}: truncated", name, path, at, size,
                    archive_bytes);
    if (regular) members.push_back({std::move(path), data_at, size});
    at = data_at + round_up(size);
  }
  MGBENCH_REQUIRE(ended, DataError, "{}: truncated: {} at byte {} (the file ends at byte {}; {} member(s) before it)",
                  name, at < archive_bytes ? "a header cut off" : "no end-of-archive block", at, archive_bytes,
                  members.size());
  return members;
}

std::vector<TarMember> list_tar_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MGBENCH_REQUIRE(fd >= 0, DataError, "{}: cannot open ({})", path, std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  const TarRead read = [fd](std::int64_t offset, std::span<std::uint8_t> out) {
    std::size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset) + done);
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    return done;
  };
  try {
    auto members = list_tar_members(read, st.st_size, path);
    ::close(fd);
    return members;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

}  // namespace mgbench::data
