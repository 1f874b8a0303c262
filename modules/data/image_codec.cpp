#include "data/image_codec.h"

#include <spng.h>
#include <turbojpeg.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <memory>
#include <stdexcept>

#include "core/error.h"

namespace mgbench::data {
namespace {

constexpr std::array<std::uint8_t, 3> kJpegSignature = {0xFF, 0xD8, 0xFF};
constexpr std::array<std::uint8_t, 8> kPngSignature = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

template <std::size_t N>
bool starts_with(std::span<const std::uint8_t> bytes, const std::array<std::uint8_t, N>& signature) {
  return bytes.size() >= N && std::equal(signature.begin(), signature.end(), bytes.begin());
}

// One TurboJPEG decompressor per thread (loader threads decode concurrently; a handle is not
// thread-safe), one compressor likewise.
struct TjHandle {
  tjhandle handle;
  explicit TjHandle(tjhandle h) : handle(h) {}
  ~TjHandle() {
    if (handle != nullptr) tjDestroy(handle);
  }
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
};

tjhandle decompressor() {
  thread_local TjHandle h(tjInitDecompress());
  if (h.handle == nullptr) throw std::runtime_error("TurboJPEG: tjInitDecompress failed");
  return h.handle;
}

tjhandle compressor() {
  thread_local TjHandle h(tjInitCompress());
  if (h.handle == nullptr) throw std::runtime_error("TurboJPEG: tjInitCompress failed");
  return h.handle;
}

using SpngContext = std::unique_ptr<spng_ctx, decltype(&spng_ctx_free)>;

// A decoding context over bytes, with limits that keep a hostile file's allocations bounded.
SpngContext png_reader(std::span<const std::uint8_t> bytes, std::string_view name) {
  SpngContext ctx(spng_ctx_new(0), &spng_ctx_free);
  MGBENCH_REQUIRE(ctx != nullptr, DataError, "{}: libspng could not allocate a decoder", name);
  spng_set_image_limits(ctx.get(), 1u << 24, 1u << 24);
  spng_set_chunk_limits(ctx.get(), 1u << 26, 1u << 26);
  const int rc = spng_set_png_buffer(ctx.get(), bytes.data(), bytes.size());
  MGBENCH_REQUIRE(rc == 0, DataError, "{}: not a readable PNG ({})", name, spng_strerror(rc));
  return ctx;
}

// TurboJPEG returns -1 for libjpeg's warnings too. PIL decodes through those (an unknown JFIF
// revision, extraneous bytes between markers) and refuses a file that ends early: so does this.
bool acceptable(tjhandle tj, int rc) {
  if (rc == 0) return true;
  if (tjGetErrorCode(tj) != TJERR_WARNING) return false;
  std::string message = tjGetErrorStr2(tj);
  std::transform(message.begin(), message.end(), message.begin(), [](unsigned char c) { return std::tolower(c); });
  return message.find("premature end") == std::string::npos;
}

ImageInfo jpeg_info(std::span<const std::uint8_t> bytes, std::string_view name) {
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  tjhandle tj = decompressor();
  const int rc = tjDecompressHeader3(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), &width, &height,
                                     &subsampling, &colorspace);
  MGBENCH_REQUIRE(acceptable(tj, rc), DataError, "{}: a corrupt JPEG header ({})", name, tjGetErrorStr2(tj));
  return {ImageFormat::kJpeg, width, height, colorspace == TJCS_CMYK || colorspace == TJCS_YCCK};
}

ImageInfo png_info(std::span<const std::uint8_t> bytes, std::string_view name) {
  SpngContext ctx = png_reader(bytes, name);
  spng_ihdr ihdr{};
  const int rc = spng_get_ihdr(ctx.get(), &ihdr);
  MGBENCH_REQUIRE(rc == 0, DataError, "{}: a corrupt PNG header ({})", name, spng_strerror(rc));
  return {ImageFormat::kPng, ihdr.width, ihdr.height};
}

// PIL's cmyk2rgb (libImaging/Convert.c) on the inverted CMYK that libjpeg returns for Adobe files:
// PIL reads them as "CMYK;I" (255 - v), then R = 255 - min(255, C + K - C K / 255).
void inverted_cmyk_to_rgb(std::span<const std::uint8_t> cmyk, std::span<std::uint8_t> rgb) {
  const std::size_t pixels = rgb.size() / 3;
  for (std::size_t p = 0; p < pixels; ++p) {
    const int nk = cmyk[4 * p + 3];  // 255 - K, as stored inverted
    for (std::size_t c = 0; c < 3; ++c) {
      const int v = 255 - cmyk[4 * p + c];  // C, M or Y
      int tmp = v * nk + 128;               // MULDIV255(v, nk)
      tmp = ((tmp >> 8) + tmp) >> 8;
      const int out = nk - tmp;
      rgb[3 * p + c] = static_cast<std::uint8_t>(out < 0 ? 0 : out > 255 ? 255 : out);
    }
  }
}

void decode_jpeg(std::span<const std::uint8_t> bytes, const ImageInfo& info, std::span<std::uint8_t> out,
                 std::string_view name) {
  // The header was read by read_image_info (info): tjDecompress2 parses it again itself.
  tjhandle tj = decompressor();
  const bool cmyk = info.cmyk;
  std::vector<std::uint8_t> cmyk_pixels(cmyk ? static_cast<std::size_t>(info.width * info.height * 4) : 0);
  std::uint8_t* target = cmyk ? cmyk_pixels.data() : out.data();
  const int rc =
      tjDecompress2(tj, bytes.data(), static_cast<unsigned long>(bytes.size()), target, static_cast<int>(info.width), 0,
                    static_cast<int>(info.height), cmyk ? TJPF_CMYK : TJPF_RGB, TJFLAG_LIMITSCANS);
  MGBENCH_REQUIRE(acceptable(tj, rc), DataError, "{}: a truncated or corrupt JPEG ({})", name, tjGetErrorStr2(tj));
  if (cmyk) inverted_cmyk_to_rgb(cmyk_pixels, out);
}

void decode_png(std::span<const std::uint8_t> bytes, std::span<std::uint8_t> out, std::string_view name) {
  SpngContext ctx = png_reader(bytes, name);
  std::size_t size = 0;
  int rc = spng_decoded_image_size(ctx.get(), SPNG_FMT_RGB8, &size);
  MGBENCH_REQUIRE(rc == 0, DataError, "{}: a corrupt PNG ({})", name, spng_strerror(rc));
  MGBENCH_REQUIRE(size == out.size(), DataError, "{}: the PNG decodes to {} bytes, its header says {}", name, size,
                  out.size());
  rc = spng_decode_image(ctx.get(), out.data(), out.size(), SPNG_FMT_RGB8, 0);
  MGBENCH_REQUIRE(rc == 0, DataError, "{}: a truncated or corrupt PNG ({})", name, spng_strerror(rc));
}

}  // namespace

std::string_view format_name(ImageFormat format) { return format == ImageFormat::kJpeg ? "jpeg" : "png"; }

std::optional<ImageFormat> image_format(std::span<const std::uint8_t> first_bytes) {
  if (starts_with(first_bytes, kJpegSignature)) return ImageFormat::kJpeg;
  if (starts_with(first_bytes, kPngSignature)) return ImageFormat::kPng;
  return std::nullopt;
}

ImageInfo read_image_info(std::span<const std::uint8_t> bytes, std::string_view name) {
  MGBENCH_REQUIRE(!bytes.empty(), DataError, "{}: an empty file, not an image", name);
  const std::optional<ImageFormat> kind = image_format(bytes);
  MGBENCH_REQUIRE(kind.has_value(), DataError, "{}: neither a JPEG nor a PNG file (its first bytes: {:02x})", name,
                  fmt::join(bytes.first(std::min<std::size_t>(bytes.size(), 8)), " "));
  ImageInfo info = *kind == ImageFormat::kJpeg ? jpeg_info(bytes, name) : png_info(bytes, name);
  const char* format = info.format == ImageFormat::kJpeg ? "JPEG" : "PNG";
  MGBENCH_REQUIRE(info.width > 0 && info.height > 0, DataError, "{}: a corrupt or truncated {} header ({} x {} px)",
                  name, format, info.width, info.height);
  MGBENCH_REQUIRE(info.width * info.height <= kMaxImagePixels, DataError,
                  "{}: a {} of {} x {} px (at most {} pixels are decoded)", name, format, info.width, info.height,
                  kMaxImagePixels);
  return info;
}

void decode_rgb(std::span<const std::uint8_t> bytes, const ImageInfo& info, std::span<std::uint8_t> out,
                std::string_view name) {
  if (static_cast<std::int64_t>(out.size()) != info.rgb_bytes()) {
    throw std::invalid_argument(
        fmt::format("decode_rgb: {} output bytes for a {} x {} image", out.size(), info.width, info.height));
  }
  if (info.format == ImageFormat::kJpeg) {
    decode_jpeg(bytes, info, out, name);
  } else {
    decode_png(bytes, out, name);
  }
}

std::vector<std::uint8_t> encode_jpeg(std::span<const std::uint8_t> rgb, std::int64_t width, std::int64_t height,
                                      int quality) {
  if (width < 1 || height < 1 || static_cast<std::int64_t>(rgb.size()) != width * height * 3 || quality < 1 ||
      quality > 100) {
    throw std::invalid_argument(
        fmt::format("encode_jpeg: {} bytes for {} x {} px at quality {}", rgb.size(), width, height, quality));
  }
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(compressor(), rgb.data(), static_cast<int>(width), 0, static_cast<int>(height), TJPF_RGB,
                             &jpeg, &size, TJSAMP_420, quality, 0);
  std::unique_ptr<unsigned char, decltype(&tjFree)> owned(jpeg, &tjFree);
  if (rc != 0) throw std::runtime_error(fmt::format("TurboJPEG: {}", tjGetErrorStr2(compressor())));
  return {jpeg, jpeg + size};
}

std::vector<std::uint8_t> encode_png(std::span<const std::uint8_t> rgb, std::int64_t width, std::int64_t height) {
  if (width < 1 || height < 1 || static_cast<std::int64_t>(rgb.size()) != width * height * 3) {
    throw std::invalid_argument(fmt::format("encode_png: {} bytes for {} x {} px", rgb.size(), width, height));
  }
  SpngContext ctx(spng_ctx_new(SPNG_CTX_ENCODER), &spng_ctx_free);
  MGBENCH_REQUIRE(ctx != nullptr, DataError, "libspng could not allocate an encoder");
  spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = static_cast<std::uint32_t>(width);
  ihdr.height = static_cast<std::uint32_t>(height);
  ihdr.bit_depth = 8;
  ihdr.color_type = SPNG_COLOR_TYPE_TRUECOLOR;
  spng_set_ihdr(ctx.get(), &ihdr);
  int rc = spng_encode_image(ctx.get(), rgb.data(), rgb.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  MGBENCH_REQUIRE(rc == 0, DataError, "libspng: encoding a {} x {} PNG failed ({})", width, height, spng_strerror(rc));
  std::size_t size = 0;
  void* png = spng_get_png_buffer(ctx.get(), &size, &rc);
  MGBENCH_REQUIRE(png != nullptr && rc == 0, DataError, "libspng: no PNG buffer ({})", spng_strerror(rc));
  std::unique_ptr<void, decltype(&std::free)> owned(png, &std::free);
  const auto* data = static_cast<const std::uint8_t*>(png);
  return {data, data + size};
}

}  // namespace mgbench::data
