#include "data/device_decode.h"

#include <array>
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "data/image_codec.h"
#include "data/image_transforms.h"
#include "data/transforms.h"

#if MGBENCH_HAVE_NVJPEG
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nvjpeg.h>
#endif

namespace mgbench::data {
namespace {

std::atomic<std::int64_t> decoded_batched{0}, decoded_per_image{0}, decoded_host{0};

}  // namespace

std::string_view nvjpeg_backend_name(NvjpegBackend backend) {
  switch (backend) {
    case NvjpegBackend::kAuto:
      return "auto";
    case NvjpegBackend::kHardware:
      return "hardware";
    case NvjpegBackend::kGpuHybrid:
      return "gpu-hybrid";
    case NvjpegBackend::kHybrid:
      return "hybrid";
  }
  return "?";
}

DeviceDecodeCounts device_decode_counts() {
  return {decoded_batched.load(), decoded_per_image.load(), decoded_host.load()};
}

bool nvjpeg_available() {
#if MGBENCH_HAVE_NVJPEG
  return true;
#else
  return false;
#endif
}

#if MGBENCH_HAVE_NVJPEG
namespace {

bool starts_with_jpeg(std::span<const std::uint8_t> file) {
  return file.size() >= 3 && file[0] == 0xFF && file[1] == 0xD8 && file[2] == 0xFF;
}

// A float [3, h, w] image's crop (a row of assemble_encoded_bytes' crops): the box resized to S x S
// and flipped, or, for a centre row, Resize(S) of the shorter side and CenterCrop(S) -- the host
// path's transforms, in floating point on the device.
torch::Tensor crop_on_device(const torch::Tensor& chw, const std::int64_t* crop, std::int64_t size) {
  if (crop[7] != 0) return resize_and_center_crop(chw, size);
  return resized_crop(chw, {crop[0], crop[1], crop[2], crop[3]}, size, size, crop[4] != 0);
}

// The host decode of a file nvJPEG leaves: uint8 [h, w, 3] on the host.
torch::Tensor decode_on_host(std::span<const std::uint8_t> bytes, const std::string& name) {
  const ImageInfo info = read_image_info(bytes, name);
  torch::Tensor hwc = torch::empty({info.height, info.width, 3}, torch::kUInt8);
  decode_rgb(bytes, info, {hwc.data_ptr<std::uint8_t>(), static_cast<std::size_t>(hwc.numel())}, name);
  return hwc;
}

nvjpegBackend_t to_nvjpeg(NvjpegBackend backend) {
  switch (backend) {
    case NvjpegBackend::kHardware:
      return NVJPEG_BACKEND_HARDWARE;
    case NvjpegBackend::kGpuHybrid:
      return NVJPEG_BACKEND_GPU_HYBRID;
    case NvjpegBackend::kHybrid:
      return NVJPEG_BACKEND_HYBRID;
    case NvjpegBackend::kAuto:
      break;
  }
  return NVJPEG_BACKEND_DEFAULT;
}

// A handle and decoding state of one back-end. The batched ones also hold a header parse (for
// nvjpegDecodeBatchedSupported) and the event of their last batch: nvJPEG stages a batch's
// bitstreams in the state's pinned buffers, which the previous batch's copies to the device may
// still be reading, so a batch starts after the last one's decode has run (as NVIDIA's nvImageCodec
// waits); the last batch's bytes are kept alive until then too. The per-image one's event: its last
// call's per-image decodes, which its next call waits for before reusing the state's buffers.
struct Decoder {
  nvjpegHandle_t handle = nullptr;
  nvjpegJpegState_t state = nullptr;
  nvjpegJpegStream_t header = nullptr;
  c10::cuda::CUDAEvent done;
  torch::Tensor in_flight;
};

struct Opened {
  Decoder* decoder = nullptr;  // null where nvjpegCreateEx refused (the JPEG engines on a GPU without them)
  nvjpegStatus_t status = NVJPEG_STATUS_SUCCESS;
};

// Each back-end opened on first use on the rank's GPU and kept to the end of the process (not
// destroyed at exit, when the CUDA context may be gone already).
const Opened& open(NvjpegBackend backend) {
  static std::mutex mutex;
  static std::array<std::optional<Opened>, 4> opened;
  const std::lock_guard lock(mutex);
  std::optional<Opened>& slot = opened.at(static_cast<std::size_t>(backend));
  if (!slot) {
    auto* d = new Decoder;
    nvjpegStatus_t rc = nvjpegCreateEx(to_nvjpeg(backend), nullptr, nullptr, 0, &d->handle);
    if (rc == NVJPEG_STATUS_SUCCESS) rc = nvjpegJpegStateCreate(d->handle, &d->state);
    if (rc == NVJPEG_STATUS_SUCCESS && backend != NvjpegBackend::kHybrid) {
      rc = nvjpegJpegStreamCreate(d->handle, &d->header);
    }
    if (rc != NVJPEG_STATUS_SUCCESS) {
      if (d->header != nullptr) nvjpegJpegStreamDestroy(d->header);
      if (d->state != nullptr) nvjpegJpegStateDestroy(d->state);
      if (d->handle != nullptr) nvjpegDestroy(d->handle);
      delete d;
      d = nullptr;
    }
    slot = Opened{d, rc};
  }
  return *slot;
}

Decoder& opened(NvjpegBackend backend) {
  const Opened& o = open(backend);
  if (o.decoder == nullptr) {
    throw std::runtime_error(fmt::format("nvJPEG: opening the {} back-end failed (nvjpegCreateEx: status {})",
                                         nvjpeg_backend_name(backend), static_cast<int>(o.status)));
  }
  return *o.decoder;
}

// Whether nvJPEG reads this stream as the host's header parse did: 1 or 3 components of a known
// subsampling and the same size (the output buffer is sized from the host's read; nvJPEG's decode
// calls take no size).
bool nvjpeg_reads_as_host(nvjpegHandle_t handle, std::span<const std::uint8_t> bytes, std::int64_t height,
                          std::int64_t width) {
  int components = 0;
  nvjpegChromaSubsampling_t subsampling = NVJPEG_CSS_UNKNOWN;
  int widths[NVJPEG_MAX_COMPONENT] = {}, heights[NVJPEG_MAX_COMPONENT] = {};
  return nvjpegGetImageInfo(handle, bytes.data(), bytes.size(), &components, &subsampling, widths, heights) ==
             NVJPEG_STATUS_SUCCESS &&
         (components == 1 || components == 3) && subsampling != NVJPEG_CSS_UNKNOWN && widths[0] == width &&
         heights[0] == height;
}

// Whether the JPEG engines take this stream (baseline, one scan, a subsampling they decode).
bool engines_take(const Decoder& engines, std::span<const std::uint8_t> bytes) {
  int unsupported = 1;  // nvjpegDecodeBatchedSupported sets 0 for a stream it decodes
  return nvjpegJpegStreamParseHeader(engines.handle, bytes.data(), bytes.size(), engines.header) ==
             NVJPEG_STATUS_SUCCESS &&
         nvjpegDecodeBatchedSupported(engines.handle, engines.header, &unsupported) == NVJPEG_STATUS_SUCCESS &&
         unsupported == 0;
}

bool refused_stream(nvjpegStatus_t rc) {
  return rc == NVJPEG_STATUS_BAD_JPEG || rc == NVJPEG_STATUS_JPEG_NOT_SUPPORTED ||
         rc == NVJPEG_STATUS_INCOMPLETE_BITSTREAM || rc == NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED;
}

// Runs decode, and once more after giving LibTorch's cached free blocks back where nvJPEG ran out of
// device memory (it allocates with cudaMalloc, outside the cache).
template <typename Decode>
nvjpegStatus_t with_memory_retry(Decode decode) {
  nvjpegStatus_t rc = decode();
  if (rc == NVJPEG_STATUS_ALLOCATOR_FAILURE) {
    c10::cuda::CUDACachingAllocator::emptyCache();
    rc = decode();
  }
  return rc;
}

std::string failure(std::string_view call, nvjpegStatus_t rc) {
  return fmt::format("nvJPEG's {} failed (status {}{})", call, static_cast<int>(rc),
                     rc == NVJPEG_STATUS_ALLOCATOR_FAILURE ? ": out of device memory" : "");
}

// The files of one batch: bytes [N] uint8 on the host, offsets [B + 1], crops [B, 8] (top, left,
// height, width, flip, image height, image width, centre) as assemble_encoded_bytes lays them out.
struct EncodedBatch {
  const Batch& batch;
  std::span<const std::uint8_t> file(std::int64_t k) const {
    const auto* offsets = batch.host_tensors[1].data_ptr<std::int64_t>();
    return {batch.host_tensors[0].data_ptr<std::uint8_t>() + offsets[k],
            static_cast<std::size_t>(offsets[k + 1] - offsets[k])};
  }
  const std::int64_t* crop(std::int64_t k) const { return batch.host_tensors[2].data_ptr<std::int64_t>() + 8 * k; }
  std::string name(std::int64_t k) const {
    return static_cast<std::size_t>(k) < batch.sample_names.size() ? batch.sample_names[static_cast<std::size_t>(k)]
                                                                   : fmt::format("sample {} of the batch", k);
  }
};

torch::Tensor empty_image(const std::int64_t* crop, const torch::Device& device) {
  return torch::empty({crop[5], crop[6], 3}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
}

nvjpegImage_t interleaved(torch::Tensor& hwc) {
  nvjpegImage_t image{};
  image.channel[0] = hwc.data_ptr<std::uint8_t>();
  image.pitch[0] = static_cast<std::size_t>(hwc.size(1) * 3);
  return image;
}

// nvjpegDecodeBatched of the samples ks into hwc[k] (uint8 [h, w, 3] on device); false where nvJPEG
// refuses the batch as a whole (a stream in it it cannot decode: each image then goes alone).
bool decode_batched(Decoder& d, const EncodedBatch& in, std::span<const std::int64_t> ks, const torch::Device& device,
                    const c10::cuda::CUDAStream& stream, std::vector<torch::Tensor>& hwc) {
  d.done.synchronize();
  d.in_flight = in.batch.host_tensors[0];
  std::vector<const unsigned char*> data;
  std::vector<std::size_t> lengths;
  std::vector<torch::Tensor> out;
  std::vector<nvjpegImage_t> images;
  for (const std::int64_t k : ks) {
    data.push_back(in.file(k).data());
    lengths.push_back(in.file(k).size());
    out.push_back(empty_image(in.crop(k), device));
    images.push_back(interleaved(out.back()));
  }
  const nvjpegStatus_t rc = with_memory_retry([&] {
    nvjpegStatus_t s =
        nvjpegDecodeBatchedInitialize(d.handle, d.state, static_cast<int>(ks.size()), 1, NVJPEG_OUTPUT_RGBI);
    if (s == NVJPEG_STATUS_SUCCESS) {
      s = nvjpegDecodeBatched(d.handle, d.state, data.data(), lengths.data(), images.data(), stream.stream());
    }
    return s;
  });
  d.done.record(stream);
  if (refused_stream(rc)) return false;
  if (rc != NVJPEG_STATUS_SUCCESS) {
    throw std::runtime_error(fmt::format("{} (a batch of {} images, the first {})", failure("nvjpegDecodeBatched", rc),
                                         ks.size(), in.name(ks.front())));
  }
  for (std::size_t i = 0; i < ks.size(); ++i) hwc[static_cast<std::size_t>(ks[i])] = out[i];
  decoded_batched += static_cast<std::int64_t>(ks.size());
  return true;
}

// nvjpegDecode of one image: uint8 [h, w, 3] on device, or an undefined tensor where nvJPEG refuses
// the stream (the host then decodes it, or names what is wrong with it).
torch::Tensor decode_one(Decoder& d, const EncodedBatch& in, std::int64_t k, const torch::Device& device,
                         const c10::cuda::CUDAStream& stream) {
  torch::Tensor hwc = empty_image(in.crop(k), device);
  nvjpegImage_t image = interleaved(hwc);
  const std::span<const std::uint8_t> file = in.file(k);
  const nvjpegStatus_t rc = with_memory_retry([&] {
    return nvjpegDecode(d.handle, d.state, file.data(), file.size(), NVJPEG_OUTPUT_RGBI, &image, stream.stream());
  });
  if (refused_stream(rc)) return {};
  if (rc != NVJPEG_STATUS_SUCCESS)
    throw std::runtime_error(fmt::format("{}: {}", in.name(k), failure("nvjpegDecode", rc)));
  ++decoded_per_image;
  return hwc;
}

}  // namespace
#endif

NvjpegBackend resolve_nvjpeg_backend(NvjpegBackend backend, const torch::Device& device) {
  MGBENCH_REQUIRE(device.is_cuda(), ConfigError, "--decode device needs a GPU (this rank runs on {})", device.str());
  MGBENCH_REQUIRE(nvjpeg_available(), ConfigError,
                  "--decode device: this mgbench was built without nvJPEG (pip install nvidia-nvjpeg beside torch, or "
                  "-DMGBENCH_NVJPEG_ROOT=...; see docs/datasets.md)");
#if !MGBENCH_HAVE_NVJPEG
  return backend;
#else
  const c10::cuda::CUDAGuard guard(device);
  std::string why;  // why auto did not take the engines
  if (backend == NvjpegBackend::kAuto) {
    const Opened& engines = open(NvjpegBackend::kHardware);
    backend = engines.decoder != nullptr ? NvjpegBackend::kHardware : NvjpegBackend::kGpuHybrid;
    if (engines.decoder == nullptr) {
      why = fmt::format("; no JPEG engines here (nvjpegCreateEx: status {})", static_cast<int>(engines.status));
    }
  }
  const Opened& o = open(backend);
  MGBENCH_REQUIRE(o.decoder != nullptr || backend != NvjpegBackend::kHardware, ConfigError,
                  "--nvjpeg-backend hardware: nvJPEG finds no JPEG engines on {} (nvjpegCreateEx: status {}); "
                  "--nvjpeg-backend gpu-hybrid decodes on the GPU's SMs",
                  device.str(), static_cast<int>(o.status));
  opened(backend);  // throws for another back-end that does not open
  static std::array<std::once_flag, 4> logged;
  std::call_once(logged.at(static_cast<std::size_t>(backend)), [backend, &why] {
    log::info("--decode device: nvJPEG {} ({}); PNG and CMYK files on the host{}", nvjpeg_backend_name(backend),
              backend == NvjpegBackend::kHardware    ? "batches on the GPU's JPEG engines, progressive JPEGs per image"
              : backend == NvjpegBackend::kGpuHybrid ? "batches with Huffman decoding on the GPU"
                                                     : "per image, Huffman decoding on the host",
              why);
  });
  return backend;
#endif
}

torch::Tensor decode_and_crop_on_device(const Batch& batch, NvjpegBackend backend, std::int64_t size,
                                        const torch::Device& device, torch::ScalarType dtype,
                                        std::span<const double> mean, std::span<const double> std) {
  backend = resolve_nvjpeg_backend(backend, device);
#if !MGBENCH_HAVE_NVJPEG
  (void)batch, (void)size, (void)dtype, (void)mean, (void)std;
  return {};
#else
  MGBENCH_REQUIRE(batch.host_tensors.size() == 3, std::invalid_argument,
                  "decode_and_crop_on_device expects a batch of assemble_encoded_bytes");
  const EncodedBatch in{batch};
  const std::int64_t b = batch.samples;
  const c10::cuda::CUDAGuard guard(device);
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device.index());
  Decoder& single = opened(NvjpegBackend::kHybrid);
  // Which files nvJPEG takes, and of those which go to the batched decoder.
  std::vector<bool> jpeg(static_cast<std::size_t>(b));
  std::vector<std::int64_t> batched;
  for (std::int64_t k = 0; k < b; ++k) {
    const std::int64_t* crop = in.crop(k);
    jpeg[static_cast<std::size_t>(k)] =
        starts_with_jpeg(in.file(k)) && nvjpeg_reads_as_host(single.handle, in.file(k), crop[5], crop[6]);
    if (jpeg[static_cast<std::size_t>(k)] && backend != NvjpegBackend::kHybrid &&
        (backend != NvjpegBackend::kHardware || engines_take(opened(backend), in.file(k)))) {
      batched.push_back(k);
    }
  }
  std::vector<torch::Tensor> hwc(static_cast<std::size_t>(b));
  if (!batched.empty()) decode_batched(opened(backend), in, batched, device, stream, hwc);
  // The per-image state's buffers: used once the last call's per-image kernels are done, which may
  // have run on another stream (training decodes on the feeder's copy stream, evaluation on the
  // compute stream).
  bool per_image = false;
  torch::Tensor out = torch::empty({b, 3, size, size}, torch::TensorOptions().dtype(dtype).device(device),
                                   torch::MemoryFormat::ChannelsLast);
  for (std::int64_t k = 0; k < b; ++k) {
    torch::Tensor& image = hwc[static_cast<std::size_t>(k)];
    if (!image.defined() && jpeg[static_cast<std::size_t>(k)]) {
      if (!per_image) single.done.synchronize();
      per_image = true;
      image = decode_one(single, in, k, device, stream);
    }
    if (!image.defined()) {
      image = decode_on_host(in.file(k), in.name(k)).to(device);
      ++decoded_host;
    }
    out[k].copy_(crop_on_device(image.permute({2, 0, 1}).to(torch::kFloat32), in.crop(k), size));
  }
  if (per_image) single.done.record(stream);
  normalize_(out, mean, std);
  return out;
#endif
}

}  // namespace mgbench::data
