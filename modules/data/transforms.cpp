#include "data/transforms.h"

#include <stdexcept>
#include <vector>

namespace mgbench::data {

torch::Tensor normalize_and_resize(const torch::Tensor& images, std::int64_t size, torch::ScalarType dtype,
                                   std::span<const double> mean, std::span<const double> std) {
  if (images.dim() != 4 || images.scalar_type() != torch::kUInt8 || size < 1) {
    throw std::invalid_argument("normalize_and_resize expects uint8 [B, C, h, w] and size >= 1");
  }
  const std::int64_t channels = images.size(1);
  const auto values = static_cast<std::int64_t>(mean.size());
  if (values != static_cast<std::int64_t>(std.size()) || (values != 1 && values != channels)) {
    throw std::invalid_argument("normalize_and_resize expects one mean and std, or one per channel");
  }
  torch::Tensor x = images.to(dtype);
  if (values == 1) {
    // One fused affine map: x * (1 / (255 std)) - mean / std.
    x.mul_(1.0 / (255.0 * std[0])).sub_(mean[0] / std[0]);
  } else {
    std::vector<double> scale(mean.size()), shift(mean.size());
    for (std::size_t c = 0; c < mean.size(); ++c) {
      scale[c] = 1.0 / (255.0 * std[c]);
      shift[c] = mean[c] / std[c];
    }
    const auto as_channels = [&](const std::vector<double>& v) {
      return torch::tensor(v, torch::kFloat64).to(x.device(), dtype).view({1, channels, 1, 1});
    };
    x.mul_(as_channels(scale)).sub_(as_channels(shift));
  }
  if (x.size(2) == size && x.size(3) == size) return x;
  namespace F = torch::nn::functional;
  return F::interpolate(x, F::InterpolateFuncOptions()
                               .size(std::vector<std::int64_t>{size, size})
                               .mode(torch::kBilinear)
                               .align_corners(false));
}

}  // namespace mgbench::data
