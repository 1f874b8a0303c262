#pragma once
// On-device image transforms: uint8 -> normalised floating point -> bilinear upscale.
#include <cstdint>

#include <torch/torch.h>

namespace mgbench::data {

/// images: uint8 [B, C, h, w] on the compute device. Returns [B, C, size, size] of dtype:
/// (x / 255 - mean) / std, resized with bilinear interpolation (align_corners = false, the
/// behaviour of torchvision.transforms.Resize on tensors for upscaling). Normalising before
/// resizing equals resizing first: bilinear weights sum to one.
/// Throws std::invalid_argument when images is not 4-D uint8 or size < 1.
torch::Tensor normalize_and_resize(const torch::Tensor& images, std::int64_t size, torch::ScalarType dtype, double mean,
                                   double std);

}  // namespace mgbench::data
