#pragma once
// The device half of --decode device: the JPEG bitstreams and crops of assemble_encoded_bytes
// (data/encoded_images.h) decoded with nvJPEG into device memory, cropped, resized and normalised
// there -- the role NVIDIA DALI's decoder plays in the second paper's scenario B. A batch's JPEGs go
// to nvjpegDecodeBatched on the current CUDA stream, on the GPU's JPEG engines where it has them
// (NVJPEG_BACKEND_HARDWARE: A100, H100, H200) or with the Huffman stage on the GPU
// (NVJPEG_BACKEND_GPU_HYBRID); what the batched decoder does not take (progressive JPEGs on the
// engines) is decoded per image by nvjpegDecode (Huffman on the calling thread, the rest on the GPU);
// what nvJPEG does not decode at all (PNG files, CMYK JPEGs, a stream whose size nvJPEG reads
// otherwise than the host's header parse) is decoded on the host (data/image_codec.h) and copied up.
//
// Differences from --decode host, stated: nvJPEG's IDCT and chroma upsampling are not libjpeg's
// (pixels differ by a few levels: the H200 reading gave a mean under 1 level, p99 under 4.1), and the
// resize runs in floating point on the device where the host resizes uint8 (no rounding to 8 bits
// before normalising). The crop boxes and flips are the same.
#include <cstdint>
#include <span>
#include <string_view>

#include <torch/torch.h>

#include "data/encoded_images.h"
#include "data/loader.h"

namespace mgbench::data {

/// nvJPEG's back-ends as --nvjpeg-backend names them (nvjpegBackend_t in nvjpeg.h).
enum class NvjpegBackend {
  kAuto,       ///< kHardware where the GPU has JPEG engines, else kGpuHybrid
  kHardware,   ///< batched on the JPEG engines: baseline single-scan JPEGs, not 4:1:0 / 4:1:1 chroma
  kGpuHybrid,  ///< batched, Huffman decoding on the GPU (nvJPEG does so for batches over 50 images)
  kHybrid,     ///< per image: Huffman on the calling thread, IDCT and colour conversion on the GPU
};

/// "auto", "hardware", "gpu-hybrid", "hybrid".
std::string_view nvjpeg_backend_name(NvjpegBackend backend);

/// Images decoded in this process so far, by path: nvjpegDecodeBatched, nvjpegDecode per image, the host.
struct DeviceDecodeCounts {
  std::int64_t batched = 0;
  std::int64_t per_image = 0;
  std::int64_t host = 0;
};
DeviceDecodeCounts device_decode_counts();

/// Whether this build has nvJPEG (CMake found it: the pip wheel nvidia-nvjpeg, or the CUDA toolkit's).
bool nvjpeg_available();

/// The back-end backend stands for on device's GPU: kAuto becomes kHardware where nvJPEG can open the
/// JPEG engines (nvjpegCreateEx), else kGpuHybrid; the others are returned as they are, after
/// checking that they open. Logs the choice once per back-end. Throws ConfigError when device is not
/// a CUDA device, the build has no nvJPEG or kHardware was asked for on a GPU without JPEG engines;
/// std::runtime_error when nvJPEG cannot be initialised otherwise.
NvjpegBackend resolve_nvjpeg_backend(NvjpegBackend backend, const torch::Device& device);

/// batch: from assemble_encoded_bytes (tensors {labels}, host_tensors {bytes, offsets, crops}), its
/// labels possibly already on device. Returns images [B, 3, size, size] of dtype on device,
/// channels-last, each (x / 255 - mean[c]) / std[c] of its crop (RandomResizedCrop's box resized to
/// size x size with antialiased bilinear interpolation and flipped as drawn, or for a centre row
/// Resize(size) + CenterCrop(size)), decoded as backend says (resolve_nvjpeg_backend; the file
/// header says above what each path takes).
/// Throws what resolve_nvjpeg_backend throws, DataError naming the file (batch.sample_names) that
/// neither nvJPEG nor the host can decode, std::runtime_error naming it when nvJPEG fails otherwise
/// (out of device memory after LibTorch's cache is emptied).
torch::Tensor decode_and_crop_on_device(const Batch& batch, NvjpegBackend backend, std::int64_t size,
                                        const torch::Device& device, torch::ScalarType dtype,
                                        std::span<const double> mean, std::span<const double> std);

}  // namespace mgbench::data
