#include "data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <memory>
#include <new>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/input_file.h"

namespace mgbench::data {
namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

/// Reads up to n bytes; gzread reads gzip and plain files alike.
std::size_t read_bytes(gzFile f, void* out, std::size_t n, const std::string& path) {
  std::size_t done = 0;
  auto* bytes = static_cast<unsigned char*>(out);
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
    const std::size_t got = gz_read(f, bytes + done, chunk, path, "IDX file");
    if (got == 0) break;
    done += got;
  }
  return done;
}

}  // namespace

IdxArray read_idx_u8(const std::string& path, int expected_ndims) {
  require_regular_file(path, "IDX file");
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  MGBENCH_REQUIRE(file != nullptr, DataError, "{}: cannot open (missing or unreadable)", path);
  gzFile f = file.get();

  std::array<unsigned char, 4> magic{};
  const std::size_t got = read_bytes(f, magic.data(), magic.size(), path);
  MGBENCH_REQUIRE(got == magic.size(), DataError, "{}: file too short for an IDX header ({} bytes)", path, got);
  const int ndims = magic[3];
  MGBENCH_REQUIRE(magic[0] == 0 && magic[1] == 0, DataError,
                  "{}: not an IDX file (magic number 0x{:02x}{:02x}{:02x}{:02x}, expected 0x0000{:02x}{:02x})", path,
                  magic[0], magic[1], magic[2], magic[3], 0x08, expected_ndims);
  MGBENCH_REQUIRE(magic[2] == 0x08, DataError, "{}: IDX data type 0x{:02x}, expected 0x08 (unsigned byte)", path,
                  magic[2]);
  MGBENCH_REQUIRE(ndims == expected_ndims, DataError, "{}: IDX file has {} dimensions, expected {} (magic 0x{:08x})",
                  path, ndims, expected_ndims, 0x0800 + expected_ndims);

  IdxArray out;
  std::int64_t total = 1;
  for (int d = 0; d < ndims; ++d) {
    std::array<unsigned char, 4> be{};
    MGBENCH_REQUIRE(read_bytes(f, be.data(), be.size(), path) == be.size(), DataError,
                    "{}: truncated IDX header (dimension {} of {})", path, d + 1, ndims);
    const std::int64_t dim =
        (std::int64_t{be[0]} << 24) | (std::int64_t{be[1]} << 16) | (std::int64_t{be[2]} << 8) | std::int64_t{be[3]};
    MGBENCH_REQUIRE(dim > 0 && dim <= (std::int64_t{1} << 31), DataError, "{}: IDX dimension {} has size {}", path,
                    d + 1, dim);
    out.dims.push_back(dim);
    // Checked before it can overflow (found by tests/fuzz/fuzz_idx): 2^36 x 2^31 does not fit 64 bits.
    const bool overflow = __builtin_mul_overflow(total, dim, &total);
    MGBENCH_REQUIRE(!overflow && total <= (std::int64_t{1} << 36), DataError,
                    "{}: IDX array of {} bytes is implausibly large (dimensions {})", path,
                    overflow ? "more than 2^63" : std::to_string(total), fmt::join(out.dims, " x "));
  }
  // The header is not trusted for the allocation: the data are read in chunks and the array grows
  // with what the file holds, so a header announcing 80 M images over a few MB fails as truncated
  // after reading those MB, not with std::bad_alloc (or gigabytes) first.
  constexpr std::size_t kChunk = std::size_t{64} << 20;
  const auto announced = static_cast<std::size_t>(total);
  while (out.data.size() < announced) {
    const std::size_t at = out.data.size();
    const std::size_t want = std::min(kChunk, announced - at);
    try {
      out.data.resize(at + want);
    } catch (const std::bad_alloc&) {
      throw DataError(fmt::format("{}: out of memory after {} of the {} data bytes the header announces ({})", path, at,
                                  total, fmt::join(out.dims, " x ")));
    }
    const std::size_t got = read_bytes(f, out.data.data() + at, want, path);
    if (got < want) {
      out.data.resize(at + got);
      break;
    }
  }
  MGBENCH_REQUIRE(out.data.size() == announced, DataError,
                  "{}: truncated: header announces {} data bytes ({}), file holds {}", path, total,
                  fmt::join(out.dims, " x "), out.data.size());
  unsigned char extra = 0;
  MGBENCH_REQUIRE(read_bytes(f, &extra, 1, path) == 0, DataError,
                  "{}: trailing bytes after the {} data bytes the header announces", path, total);
  return out;
}

}  // namespace mgbench::data
