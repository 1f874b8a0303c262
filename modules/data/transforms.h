#pragma once
// On-device image transforms: uint8 -> normalised floating point -> bilinear resize.
#include <array>
#include <cstdint>
#include <span>

#include <torch/torch.h>

namespace mgbench::data {

/// ImageNet's per-channel RGB mean and standard deviation of pixels in [0, 1] (torchvision's
/// weights' transforms): the normalisation of the encoded-image datasets.
inline constexpr std::array<double, 3> kImageNetMean = {0.485, 0.456, 0.406};
inline constexpr std::array<double, 3> kImageNetStd = {0.229, 0.224, 0.225};

/// x: floating point [B, C, h, w] of pixel values in [0, 255]. In place: (x / 255 - mean[c]) / std[c],
/// the factors computed in double. mean and std: one value per channel, or one for all. Returns x.
/// Throws std::invalid_argument when mean / std have neither 1 nor C values.
torch::Tensor& normalize_(torch::Tensor& x, std::span<const double> mean, std::span<const double> std);

/// images: uint8 [B, C, h, w] on the compute device (any layout). Returns [B, C, size, size] of
/// dtype: (x / 255 - mean[c]) / std[c], resized with bilinear interpolation (align_corners = false,
/// the behaviour of torchvision.transforms.Resize on tensors for upscaling) unless already that
/// size. mean and std: one value per channel, or one for all. Normalising before resizing equals
/// resizing first: bilinear weights sum to one.
/// Throws std::invalid_argument when images is not 4-D uint8, size < 1, or mean / std have neither 1
/// nor C values.
torch::Tensor normalize_and_resize(const torch::Tensor& images, std::int64_t size, torch::ScalarType dtype,
                                   std::span<const double> mean, std::span<const double> std);

}  // namespace mgbench::data
