// JPEG and PNG files (data/image_codec.h: TurboJPEG, libspng): the header read and, for images of a
// bounded size, the decode into RGB. Any input either decodes or throws DataError naming the file;
// the decoded size is the header's.
#include <vector>

#include "data/image_codec.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  mgbench::fuzz::expect_clean_errors([&] {
    const mgbench::data::ImageInfo info = mgbench::data::read_image_info(bytes, "fuzz.img");
    if (info.width <= 0 || info.height <= 0) __builtin_trap();  // refused in read_image_info
    if (info.rgb_bytes() > (64 << 20)) return;                  // large images: the header path only
    std::vector<std::uint8_t> rgb(static_cast<std::size_t>(info.rgb_bytes()));
    mgbench::data::decode_rgb(bytes, info, rgb, "fuzz.img");
  });
  return 0;
}
