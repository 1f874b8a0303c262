#pragma once
// JPEG and PNG files to 8-bit RGB pixels on the host, and back: libjpeg-turbo's TurboJPEG API and
// libspng. Decoding gives what torchvision.datasets.ImageFolder's default loader gives
// (PIL.Image.open(f).convert("RGB")): greyscale replicated to three channels, the alpha channel and
// a palette's transparency dropped, no gamma applied, JPEG with libjpeg's default (accurate
// integer) IDCT and fancy upsampling -- bitwise PIL's pixels where PIL's libjpeg-turbo decodes the
// same way. Differences, stated: a 16-bit PNG keeps each sample's high byte (PIL clips 16-bit
// greyscale to 255 instead). libjpeg's warnings pass (as in PIL) except a premature end of the
// file, refused as PIL refuses a truncated image. Torch-free (the fuzz targets build it alone).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mgbench::data {

enum class ImageFormat { kJpeg, kPng };

/// What a file's header says: its format and size in pixels.
struct ImageInfo {
  ImageFormat format = ImageFormat::kJpeg;
  std::int64_t width = 0;   // px
  std::int64_t height = 0;  // px
  bool cmyk = false;        // a CMYK or YCCK JPEG (converted to RGB as PIL converts it)
  /// Bytes decode_rgb writes: height x width x 3.
  std::int64_t rgb_bytes() const { return height * width * 3; }
};

/// The most pixels one image may have (PIL's decompression-bomb error threshold, 2 x 89478485).
inline constexpr std::int64_t kMaxImagePixels = 2 * 89478485;

/// Reads the header of the image in bytes (JPEG or PNG, told by its signature, not by name).
/// Throws DataError naming `name` (the file, or "shard.tar:key.jpg") when bytes is empty, is
/// neither format, its header is corrupt, or it has more than kMaxImagePixels pixels.
ImageInfo read_image_info(std::span<const std::uint8_t> bytes, std::string_view name);

/// Decodes the image into out: uint8 RGB, [height, width, 3] row-major (HWC); out.size() must be
/// info.rgb_bytes() (info from read_image_info of the same bytes). CMYK and YCCK JPEGs (Adobe's
/// inverted CMYK, as Photoshop and PIL write them) are converted as PIL's convert("RGB") does.
/// Throws DataError naming `name` for a truncated or corrupt image, std::invalid_argument for a
/// wrong out size.
void decode_rgb(std::span<const std::uint8_t> bytes, const ImageInfo& info, std::span<std::uint8_t> out,
                std::string_view name);

/// JPEG file bytes of rgb (uint8 [height, width, 3]) at quality 1-100: 4:2:0 chroma subsampling
/// (PIL's default), baseline, no metadata.
/// Throws std::invalid_argument for sizes that do not match or a quality outside 1-100.
std::vector<std::uint8_t> encode_jpeg(std::span<const std::uint8_t> rgb, std::int64_t width, std::int64_t height,
                                      int quality);

/// PNG file bytes of rgb (uint8 [height, width, 3]), 8-bit RGB, no interlacing.
/// Throws std::invalid_argument for sizes that do not match, DataError when libspng fails.
std::vector<std::uint8_t> encode_png(std::span<const std::uint8_t> rgb, std::int64_t width, std::int64_t height);

/// "jpeg" or "png".
std::string_view format_name(ImageFormat format);

/// The format a file's first bytes (its first 8 suffice) name by signature: JPEG's FF D8 FF or
/// PNG's 89 'PNG' 0D 0A 1A 0A; nullopt for any other (what read_image_info refuses).
std::optional<ImageFormat> image_format(std::span<const std::uint8_t> first_bytes);

}  // namespace mgbench::data
