#pragma once
// Reader of the IDX format of MNIST (http://yann.lecun.com/exdb/mnist/): a big-endian header
// (two zero bytes, a type byte, the number of dimensions, then one uint32 per dimension)
// followed by the data. gzip-compressed and raw files are both accepted (zlib).
#include <cstdint>
#include <string>
#include <vector>

namespace mgbench::data {

/// An unsigned-byte IDX array: dims e.g. {10000, 28, 28}; data.size() == product(dims).
struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> data;
};

/// Reads an IDX file of unsigned bytes (type 0x08) with expected_ndims dimensions.
/// Throws DataError naming the file when it is missing, not gzip/IDX, has another magic
/// number, type or number of dimensions, is truncated, or has trailing bytes.
IdxArray read_idx_u8(const std::string& path, int expected_ndims);

}  // namespace mgbench::data
