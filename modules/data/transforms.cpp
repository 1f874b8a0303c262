#include "data/transforms.h"

#include <stdexcept>

namespace mgbench::data {

torch::Tensor normalize_and_resize(const torch::Tensor& images, std::int64_t size, torch::ScalarType dtype, double mean,
                                   double std) {
  if (images.dim() != 4 || images.scalar_type() != torch::kUInt8 || size < 1) {
    throw std::invalid_argument("normalize_and_resize expects uint8 [B, C, h, w] and size >= 1");
  }
  // One fused affine map: x * (1 / (255 std)) - mean / std.
  torch::Tensor x = images.to(dtype).mul_(1.0 / (255.0 * std)).sub_(mean / std);
  if (x.size(2) == size && x.size(3) == size) return x;
  namespace F = torch::nn::functional;
  return F::interpolate(x, F::InterpolateFuncOptions()
                               .size(std::vector<std::int64_t>{size, size})
                               .mode(torch::kBilinear)
                               .align_corners(false));
}

}  // namespace mgbench::data
