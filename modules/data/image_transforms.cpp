#include "data/image_transforms.h"

#include <cmath>
#include <stdexcept>

#include <ATen/Version.h>
#include <fmt/format.h>

namespace mgbench::data {
namespace {

// Python's round() of a float to int: half to even (the default floating-point rounding mode).
std::int64_t python_round(double v) { return static_cast<std::int64_t>(std::nearbyint(v)); }

// torch.empty(1).uniform_(a, b).item(): a float32 draw, widened.
double uniform_float(double a, double b, at::Generator& gen) {
  return torch::empty({1}, torch::kFloat32).uniform_(a, b, gen).item<double>();
}

// torch.randint(0, n, (1,)).item()
std::int64_t randint(std::int64_t n, at::Generator& gen) {
  return torch::randint(0, n, {1}, gen, torch::TensorOptions().dtype(torch::kInt64)).item<std::int64_t>();
}

}  // namespace

CropBox random_resized_crop_box(std::int64_t height, std::int64_t width, at::Generator& gen,
                                const RandomResizedCropRange& range) {
  if (height < 1 || width < 1 || range.min_scale > range.max_scale || range.min_ratio > range.max_ratio ||
      range.min_ratio <= 0) {
    throw std::invalid_argument(fmt::format("random_resized_crop_box: a {} x {} image, scale [{}, {}], ratio [{}, {}]",
                                            height, width, range.min_scale, range.max_scale, range.min_ratio,
                                            range.max_ratio));
  }
  const auto area = static_cast<double>(height * width);
  // torch.log(torch.tensor(ratio)): float32 bounds.
  const torch::Tensor log_ratio = torch::log(torch::tensor({range.min_ratio, range.max_ratio}, torch::kFloat32));
  const double log_lo = log_ratio[0].item<double>();
  const double log_hi = log_ratio[1].item<double>();
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * uniform_float(range.min_scale, range.max_scale, gen);
    const double aspect_ratio =
        torch::exp(torch::empty({1}, torch::kFloat32).uniform_(log_lo, log_hi, gen)).item<double>();
    const std::int64_t w = python_round(std::sqrt(target_area * aspect_ratio));
    const std::int64_t h = python_round(std::sqrt(target_area / aspect_ratio));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const std::int64_t top = randint(height - h + 1, gen);
      const std::int64_t left = randint(width - w + 1, gen);
      return {top, left, h, w};
    }
  }
  // The centred box of the ratio range.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  std::int64_t w = width, h = height;
  if (in_ratio < range.min_ratio) {
    h = python_round(static_cast<double>(w) / range.min_ratio);
  } else if (in_ratio > range.max_ratio) {
    w = python_round(static_cast<double>(h) * range.max_ratio);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

bool random_flip(at::Generator& gen, double p) {
  return torch::rand({1}, gen, torch::TensorOptions().dtype(torch::kFloat32)).item<double>() < p;
}

CropBox center_crop_box(std::int64_t height, std::int64_t width, std::int64_t size) {
  if (size < 1 || height < size || width < size) {
    throw std::invalid_argument(
        fmt::format("center_crop_box: {} x {} px from a {} x {} image", size, size, height, width));
  }
  return {python_round(static_cast<double>(height - size) / 2.0), python_round(static_cast<double>(width - size) / 2.0),
          size, size};
}

std::pair<std::int64_t, std::int64_t> shorter_side_size(std::int64_t height, std::int64_t width, std::int64_t size) {
  const bool portrait = width <= height;
  const std::int64_t shorter = portrait ? width : height;
  const std::int64_t longer = portrait ? height : width;
  const auto new_long =
      static_cast<std::int64_t>(static_cast<double>(size) * static_cast<double>(longer) / static_cast<double>(shorter));
  return portrait ? std::pair{new_long, size} : std::pair{size, new_long};
}

torch::Tensor resized_crop(const torch::Tensor& image, const CropBox& box, std::int64_t out_height,
                           std::int64_t out_width, bool flip) {
  const bool uint8 = image.scalar_type() == torch::kUInt8;
  if (image.dim() != 3 || image.size(0) != 3 || !(uint8 || image.is_floating_point())) {
    throw std::invalid_argument("resized_crop expects uint8 or floating-point [3, H, W]");
  }
  torch::Tensor crop = image.slice(1, box.top, box.top + box.height).slice(2, box.left, box.left + box.width);
  if (box.height != out_height || box.width != out_width) {
    namespace F = torch::nn::functional;
    // torchvision's resize_image: uint8 through LibTorch's uint8 kernel where the CPU has AVX2 or
    // AVX-512, else through float32 and round() (_do_native_uint8_resize_on_cpu); floating point as it is.
    static const bool native_uint8 = [] {
      const std::string capability = at::get_cpu_capability();
      return capability == "AVX2" || capability == "AVX512";
    }();
    const bool through_float = uint8 && !native_uint8;
    const torch::Tensor input = through_float ? crop.unsqueeze(0).to(torch::kFloat32) : crop.unsqueeze(0);
    torch::Tensor resized = F::interpolate(input, F::InterpolateFuncOptions()
                                                      .size(std::vector<std::int64_t>{out_height, out_width})
                                                      .mode(torch::kBilinear)
                                                      .align_corners(false)
                                                      .antialias(true))
                                .squeeze(0);
    crop = through_float ? resized.round_().to(torch::kUInt8) : resized;
  }
  return flip ? crop.flip({2}) : crop;
}

torch::Tensor resize_and_center_crop(const torch::Tensor& image, std::int64_t size) {
  const auto [h, w] = shorter_side_size(image.size(1), image.size(2), size);
  const torch::Tensor resized = resized_crop(image, {0, 0, image.size(1), image.size(2)}, h, w);
  const CropBox box = center_crop_box(h, w, size);
  return resized.slice(1, box.top, box.top + size).slice(2, box.left, box.left + size);
}

}  // namespace mgbench::data
