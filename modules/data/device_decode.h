#pragma once
// The device half of --decode device: the JPEG bitstreams and crops of assemble_encoded_bytes
// (data/encoded_images.h) decoded with nvJPEG into device memory, cropped, resized and normalised
// there -- the role NVIDIA DALI's decoder plays in the second paper's scenario B. Per image, with
// nvJPEG's default (hybrid) back-end on the current CUDA stream: the Huffman stage on the calling
// thread, the IDCT and colour conversion on the GPU. What nvJPEG does not decode (PNG files, CMYK
// JPEGs, any stream whose size nvJPEG reads otherwise than the host's header parse) is decoded on
// the host (data/image_codec.h) and copied up.
//
// Differences from --decode host, stated: nvJPEG's IDCT and upsampling are not libjpeg's (pixels
// may differ by a few levels), and the resize runs in floating point on the device where the host
// resizes uint8 (no rounding to 8 bits before normalising). The crop boxes and flips are the same.
#include <cstdint>
#include <span>

#include <torch/torch.h>

#include "data/encoded_images.h"
#include "data/loader.h"

namespace mgbench::data {

/// Whether this build has nvJPEG (CMake found it: the pip wheel nvidia-nvjpeg, or the CUDA toolkit's).
bool nvjpeg_available();

/// batch: from assemble_encoded_bytes (tensors {labels}, host_tensors {bytes, offsets, crops}), its
/// labels possibly already on device. Returns images [B, 3, size, size] of dtype on device,
/// channels-last, each (x / 255 - mean[c]) / std[c] of its crop (RandomResizedCrop's box resized to
/// size x size with antialiased bilinear interpolation and flipped as drawn, or for a centre row
/// Resize(size) + CenterCrop(size)).
/// Throws ConfigError when the build has no nvJPEG or device is not a CUDA device, DataError naming
/// the file (batch.sample_names) that neither nvJPEG nor the host can decode, std::runtime_error
/// naming it when nvJPEG fails otherwise (out of device memory after the cache is emptied).
torch::Tensor decode_and_crop_on_device(const Batch& batch, std::int64_t size, const torch::Device& device,
                                        torch::ScalarType dtype, std::span<const double> mean,
                                        std::span<const double> std);

}  // namespace mgbench::data
