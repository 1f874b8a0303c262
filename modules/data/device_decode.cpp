#include "data/device_decode.h"

#include <string>

#include <fmt/format.h>

#include "core/config.h"
#include "core/error.h"
#include "data/image_codec.h"
#include "data/image_transforms.h"
#include "data/transforms.h"

#ifdef MGBENCH_HAVE_NVJPEG
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nvjpeg.h>
#endif

namespace mgbench::data {
#ifdef MGBENCH_HAVE_NVJPEG
namespace {

bool starts_with_jpeg(std::span<const std::uint8_t> file) {
  return file.size() >= 3 && file[0] == 0xFF && file[1] == 0xD8 && file[2] == 0xFF;
}

// A float [3, h, w] image's crop (a row of assemble_encoded_bytes' crops): the box resized to S x S
// (antialiased bilinear, as the host's resized_crop) and flipped; or, for a centre row, Resize(S) of
// the shorter side and CenterCrop(S).
torch::Tensor crop_on_device(const torch::Tensor& chw, const std::int64_t* crop, std::int64_t size) {
  namespace F = torch::nn::functional;
  auto resize = [](const torch::Tensor& x, std::int64_t h, std::int64_t w) {
    if (x.size(1) == h && x.size(2) == w) return x;
    return F::interpolate(x.unsqueeze(0), F::InterpolateFuncOptions()
                                              .size(std::vector<std::int64_t>{h, w})
                                              .mode(torch::kBilinear)
                                              .align_corners(false)
                                              .antialias(true))
        .squeeze(0);
  };
  if (crop[7] != 0) {
    const auto [h, w] = shorter_side_size(chw.size(1), chw.size(2), size);
    const torch::Tensor resized = resize(chw, h, w);
    const CropBox box = center_crop_box(h, w, size);
    return resized.slice(1, box.top, box.top + size).slice(2, box.left, box.left + size);
  }
  const torch::Tensor box = chw.slice(1, crop[0], crop[0] + crop[2]).slice(2, crop[1], crop[1] + crop[3]);
  const torch::Tensor out = resize(box, size, size);
  return crop[4] != 0 ? out.flip({2}) : out;
}

// The host decode of sample k (what nvJPEG leaves): uint8 [h, w, 3] on the host.
torch::Tensor decode_on_host(std::span<const std::uint8_t> bytes, const std::string& name) {
  const ImageInfo info = read_image_info(bytes, name);
  torch::Tensor hwc = torch::empty({info.height, info.width, 3}, torch::kUInt8);
  decode_rgb(bytes, info, {hwc.data_ptr<std::uint8_t>(), static_cast<std::size_t>(hwc.numel())}, name);
  return hwc;
}

// One nvJPEG handle and decoding state per process, made on first use on the training thread and
// kept to the end (not destroyed at exit, when the CUDA context may be gone already).
struct Nvjpeg {
  nvjpegHandle_t handle = nullptr;
  nvjpegJpegState_t state = nullptr;
};

Nvjpeg& nvjpeg() {
  static Nvjpeg* n = [] {
    Nvjpeg made;
    nvjpegStatus_t rc = nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, 0, &made.handle);
    if (rc == NVJPEG_STATUS_SUCCESS) rc = nvjpegJpegStateCreate(made.handle, &made.state);
    if (rc != NVJPEG_STATUS_SUCCESS) {
      if (made.handle != nullptr) nvjpegDestroy(made.handle);
      throw std::runtime_error(fmt::format("nvJPEG: initialisation failed (status {})", static_cast<int>(rc)));
    }
    return new Nvjpeg(made);
  }();
  return *n;
}

// uint8 [h, w, 3] on the device, or an undefined tensor where nvJPEG does not decode this stream:
// its own parse must find 1 or 3 components of a known subsampling and the size the host's header
// read gave (the output buffer is sized from it; nvjpegDecode takes no size).
torch::Tensor decode_with_nvjpeg(std::span<const std::uint8_t> bytes, std::int64_t height, std::int64_t width,
                                 const torch::Device& device, cudaStream_t stream, const std::string& name) {
  Nvjpeg& n = nvjpeg();
  int components = 0;
  nvjpegChromaSubsampling_t subsampling = NVJPEG_CSS_UNKNOWN;
  int widths[NVJPEG_MAX_COMPONENT] = {}, heights[NVJPEG_MAX_COMPONENT] = {};
  if (nvjpegGetImageInfo(n.handle, bytes.data(), bytes.size(), &components, &subsampling, widths, heights) !=
          NVJPEG_STATUS_SUCCESS ||
      (components != 1 && components != 3) || subsampling == NVJPEG_CSS_UNKNOWN || widths[0] != width ||
      heights[0] != height) {
    return {};
  }
  torch::Tensor hwc = torch::empty({height, width, 3}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
  nvjpegImage_t out{};
  out.channel[0] = hwc.data_ptr<std::uint8_t>();
  out.pitch[0] = static_cast<std::size_t>(width * 3);
  nvjpegStatus_t rc = nvjpegDecode(n.handle, n.state, bytes.data(), bytes.size(), NVJPEG_OUTPUT_RGBI, &out, stream);
  if (rc == NVJPEG_STATUS_ALLOCATOR_FAILURE) {
    // nvJPEG allocates with cudaMalloc, outside LibTorch's cache: give the cache's free blocks back, once.
    c10::cuda::CUDACachingAllocator::emptyCache();
    rc = nvjpegDecode(n.handle, n.state, bytes.data(), bytes.size(), NVJPEG_OUTPUT_RGBI, &out, stream);
  }
  switch (rc) {
    case NVJPEG_STATUS_SUCCESS:
      return hwc;
    case NVJPEG_STATUS_BAD_JPEG:
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED:
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM:
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED:
      return {};  // the host decodes it (or names what is wrong with it)
    default:
      throw std::runtime_error(fmt::format("{}: nvJPEG's nvjpegDecode failed (status {}{})", name, static_cast<int>(rc),
                                           rc == NVJPEG_STATUS_ALLOCATOR_FAILURE ? ": out of device memory" : ""));
  }
}

}  // namespace
#endif

bool nvjpeg_available() {
#ifdef MGBENCH_HAVE_NVJPEG
  return true;
#else
  return false;
#endif
}

torch::Tensor decode_and_crop_on_device(const Batch& batch, std::int64_t size, const torch::Device& device,
                                        torch::ScalarType dtype, std::span<const double> mean,
                                        std::span<const double> std) {
  MGBENCH_REQUIRE(nvjpeg_available(), ConfigError,
                  "--decode device: this mgbench was built without nvJPEG (pip install nvidia-nvjpeg beside torch, or "
                  "-DMGBENCH_NVJPEG_ROOT=...; see docs/datasets.md)");
  MGBENCH_REQUIRE(device.is_cuda(), ConfigError, "--decode device needs a CUDA device (this rank has {})",
                  device.str());
#ifndef MGBENCH_HAVE_NVJPEG
  (void)batch, (void)size, (void)dtype, (void)mean, (void)std;
  return {};
#else
  MGBENCH_REQUIRE(batch.host_tensors.size() == 3, std::invalid_argument,
                  "decode_and_crop_on_device expects a batch of assemble_encoded_bytes");
  const torch::Tensor& bytes = batch.host_tensors[0];
  const auto* offsets = batch.host_tensors[1].data_ptr<std::int64_t>();
  const auto* crops = batch.host_tensors[2].data_ptr<std::int64_t>();
  const std::int64_t b = batch.samples;
  torch::Tensor out = torch::empty({b, 3, size, size}, torch::TensorOptions().dtype(dtype).device(device),
                                   torch::MemoryFormat::ChannelsLast);
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  for (std::int64_t k = 0; k < b; ++k) {
    const std::span<const std::uint8_t> file(bytes.data_ptr<std::uint8_t>() + offsets[k],
                                             static_cast<std::size_t>(offsets[k + 1] - offsets[k]));
    const std::int64_t* crop = crops + 8 * k;
    const std::string name = static_cast<std::size_t>(k) < batch.sample_names.size()
                                 ? batch.sample_names[static_cast<std::size_t>(k)]
                                 : fmt::format("sample {} of the batch", k);
    torch::Tensor hwc =
        starts_with_jpeg(file) ? decode_with_nvjpeg(file, crop[5], crop[6], device, stream, name) : torch::Tensor();
    if (!hwc.defined()) hwc = decode_on_host(file, name).to(device);
    out[k].copy_(crop_on_device(hwc.permute({2, 0, 1}).to(torch::kFloat32), crop, size));
  }
  normalize_(out, mean, std);
  return out;
#endif
}

}  // namespace mgbench::data
