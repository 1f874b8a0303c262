#include "data/transforms.h"

#include <stdexcept>
#include <vector>

namespace mgbench::data {

torch::Tensor& normalize_(torch::Tensor& x, std::span<const double> mean, std::span<const double> std) {
  const std::int64_t channels = x.size(1);
  const auto values = static_cast<std::int64_t>(mean.size());
  if (values != static_cast<std::int64_t>(std.size()) || (values != 1 && values != channels)) {
    throw std::invalid_argument("normalize_ expects one mean and std, or one per channel");
  }
  if (values == 1) return x.mul_(1.0 / (255.0 * std[0])).sub_(mean[0] / std[0]);  // one fused affine map
  std::vector<double> scale(mean.size()), shift(mean.size());
  for (std::size_t c = 0; c < mean.size(); ++c) {
    scale[c] = 1.0 / (255.0 * std[c]);
    shift[c] = mean[c] / std[c];
  }
  const auto as_channels = [&](const std::vector<double>& v) {
    return torch::tensor(v, torch::kFloat64).to(x.device(), x.scalar_type()).view({1, channels, 1, 1});
  };
  return x.mul_(as_channels(scale)).sub_(as_channels(shift));
}

torch::Tensor normalize_and_resize(const torch::Tensor& images, std::int64_t size, torch::ScalarType dtype,
                                   std::span<const double> mean, std::span<const double> std) {
  if (images.dim() != 4 || images.scalar_type() != torch::kUInt8 || size < 1) {
    throw std::invalid_argument("normalize_and_resize expects uint8 [B, C, h, w] and size >= 1");
  }
  torch::Tensor x = images.to(dtype);
  normalize_(x, mean, std);
  if (x.size(2) == size && x.size(3) == size) return x;
  namespace F = torch::nn::functional;
  return F::interpolate(x, F::InterpolateFuncOptions()
                               .size(std::vector<std::int64_t>{size, size})
                               .mode(torch::kBilinear)
                               .align_corners(false));
}

}  // namespace mgbench::data
