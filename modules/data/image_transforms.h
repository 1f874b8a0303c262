#pragma once
// The host side of the image training and evaluation transforms, as torchvision defines them:
// RandomResizedCrop + RandomHorizontalFlip (training), Resize of the shorter side + CenterCrop
// (evaluation), on decoded uint8 RGB images. The draws use a CPU generator with torchvision's call
// sequence, so one seed gives torchvision's crop box and flip (transforms.RandomResizedCrop.get_params,
// torchvision 0.26); the resizing is LibTorch's antialiased bilinear interpolation as
// torchvision.transforms.v2.functional.resize(antialias=True) calls it for uint8 tensors (the uint8
// kernel on AVX2 / AVX-512 CPUs, float32 and round() elsewhere).
// Normalisation ((x / 255 - mean) / std) happens on the device (data/transforms.h).
#include <cstdint>

#include <torch/torch.h>

namespace mgbench::data {

/// A crop box in pixels of the source image.
struct CropBox {
  std::int64_t top = 0;
  std::int64_t left = 0;
  std::int64_t height = 0;
  std::int64_t width = 0;
};

/// RandomResizedCrop's scale and aspect-ratio ranges (torchvision's defaults).
struct RandomResizedCropRange {
  double min_scale = 0.08;  // of the source's area
  double max_scale = 1.0;
  double min_ratio = 3.0 / 4.0;  // width / height
  double max_ratio = 4.0 / 3.0;
};

/// torchvision.transforms.RandomResizedCrop.get_params for a height x width image: up to 10 draws of
/// an area share and a log-uniform aspect ratio, a box that fits placed uniformly, else the centred
/// box of the ratio range. Consumes gen exactly as torchvision consumes torch's default generator.
/// Throws std::invalid_argument for an empty image or an empty range.
CropBox random_resized_crop_box(std::int64_t height, std::int64_t width, at::Generator& gen,
                                const RandomResizedCropRange& range = {});

/// RandomHorizontalFlip's draw: torch.rand(1) < p.
bool random_flip(at::Generator& gen, double p = 0.5);

/// torchvision's CenterCrop box of size x size (offsets rounded half to even, as Python's round);
/// the image must be at least that large. Throws std::invalid_argument otherwise.
CropBox center_crop_box(std::int64_t height, std::int64_t width, std::int64_t size);

/// torchvision's Resize(size) output size for an int size: the shorter side becomes size, the longer
/// int(size * long / short). Returns {height, width}.
std::pair<std::int64_t, std::int64_t> shorter_side_size(std::int64_t height, std::int64_t width, std::int64_t size);

/// image: uint8 or floating-point [3, H, W] on any device (any strides; a decoded HWC buffer viewed as
/// CHW is channels-last). Returns [3, out_height, out_width] of image's dtype: box resized with
/// antialiased bilinear interpolation (align_corners false; uint8 as torchvision resizes it, floating
/// point without rounding), flipped left-right when flip; box as it is when it already has that size.
/// Throws std::invalid_argument for another shape or dtype.
torch::Tensor resized_crop(const torch::Tensor& image, const CropBox& box, std::int64_t out_height,
                           std::int64_t out_width, bool flip = false);

/// The evaluation transform: Resize(size) of the shorter side, then CenterCrop(size). [3, H, W] ->
/// [3, size, size], as resized_crop takes and gives.
torch::Tensor resize_and_center_crop(const torch::Tensor& image, std::int64_t size);

}  // namespace mgbench::data
