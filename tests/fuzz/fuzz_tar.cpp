// Tar archives (data/tar_index.h, webdataset shards): the member list of any bytes. Every member
// listed lies inside the archive; anything else is a DataError naming it.
#include <algorithm>
#include <cstring>

#include "data/tar_index.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto read = [&](std::int64_t offset, std::span<std::uint8_t> out) {
    if (offset < 0 || static_cast<std::size_t>(offset) > size) __builtin_trap();  // a read outside the archive
    const std::size_t n = std::min(out.size(), size - static_cast<std::size_t>(offset));
    if (n > 0) std::memcpy(out.data(), data + offset, n);
    return n;
  };
  mgbench::fuzz::expect_clean_errors([&] {
    for (const auto& m : mgbench::data::list_tar_members(read, static_cast<std::int64_t>(size), "fuzz.tar")) {
      if (m.offset < 0 || m.size < 0 || m.offset + m.size > static_cast<std::int64_t>(size)) __builtin_trap();
    }
  });
  return 0;
}
