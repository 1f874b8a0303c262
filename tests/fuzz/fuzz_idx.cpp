// IDX files (MNIST's format): a magic with the element type and rank, big-endian dimensions, the
// data; plain or gzip. The first byte picks images (3 dims) or labels (1 dim), the second plain
// or gzipped (the rest compressed here, so the parser sees mutated IDX bytes behind a valid gzip).
#include <zlib.h>

#include <vector>

#include "data/idx.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const int ndims = (data[0] & 1) != 0 ? 3 : 1;
  const bool gzipped = (data[1] & 1) != 0;
  data += 2;
  size -= 2;
  std::string path;
  if (gzipped) {
    path = mgbench::fuzz::write_input(nullptr, 0, "input.idx.gz");
    gzFile f = gzopen(path.c_str(), "wb");
    if (size > 0) gzwrite(f, data, static_cast<unsigned>(size));
    gzclose(f);
  } else {
    path = mgbench::fuzz::write_input(data, size, "input.idx");
  }
  mgbench::fuzz::expect_clean_errors([&] {
    const mgbench::data::IdxArray a = mgbench::data::read_idx_u8(path, ndims);
    std::size_t expected = 1;
    for (const auto d : a.dims) expected *= static_cast<std::size_t>(d);
    if (a.data.size() != expected) __builtin_trap();  // the dims must describe the data read
  });
  return 0;
}
