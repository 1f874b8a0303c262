#include "models/fake_quant.h"

#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

// Each expression below is torchao's, operation for operation (the Python `1.0 / s` is
// s.reciprocal() * 1.0, `a - t` for a number a is rsub), so that results are bitwise equal.
namespace mgbench::models {
namespace {

constexpr double kInt8Min = -128, kInt8Max = 127;
constexpr double kInt4Min = -8, kInt4Max = 7;

/// torch.finfo(dtype).eps.
double epsilon(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kBFloat16:
      return static_cast<double>(std::numeric_limits<c10::BFloat16>::epsilon());
    case torch::kFloat16:
      return static_cast<double>(std::numeric_limits<c10::Half>::epsilon());
    case torch::kFloat32:
      return static_cast<double>(std::numeric_limits<float>::epsilon());
    case torch::kFloat64:
      return std::numeric_limits<double>::epsilon();
    default:
      throw std::invalid_argument(fmt::format(
          "fake quantisation: {} is not supported (expected bf16, fp16, fp32 or fp64)", c10::toString(dtype)));
  }
}

/// q = clamp(round(x * (1 / s)) + zp, qmin, qmax); ((q - zp) as int32, to dtype) * s, to dtype
/// (torchao's _quantize_affine_no_dtype_cast + _dequantize_affine_no_dtype_check, INT domain).
/// scale, zero_point: fp32, broadcastable to x's blocks.
torch::Tensor quantize_dequantize(const torch::Tensor& x, const torch::Tensor& scale, const torch::Tensor& zero_point,
                                  double qmin, double qmax) {
  const torch::Tensor q = torch::clamp(torch::round(x * (scale.reciprocal() * 1.0)) + zero_point, qmin, qmax);
  return ((q.to(torch::kInt32) - zero_point.to(torch::kInt32)).to(x.scalar_type()) * scale).to(x.scalar_type());
}

/// Per group of the last dimension of w viewed as [out, in / G, G]: symmetric int4 scales (fp32
/// [out, in / G, 1]) as torchao's get_group_qparams_symmetric.
torch::Tensor int4_group_scales(const torch::Tensor& grouped) {
  const double eps = epsilon(grouped.scalar_type());
  const torch::Tensor mn = grouped.amin(-1, /*keepdim=*/true);
  const torch::Tensor mx = grouped.amax(-1, /*keepdim=*/true);
  const torch::Tensor mn_neg = torch::min(mn, torch::zeros_like(mn));
  const torch::Tensor mx_pos = torch::max(torch::max(mx, torch::zeros_like(mx)), -mn_neg);
  return torch::clamp(mx_pos / ((kInt4Max - kInt4Min) / 2), eps).to(torch::kFloat32);
}

torch::Tensor grouped_view(const torch::Tensor& w, std::int64_t group_size, const char* what) {
  MGBENCH_REQUIRE(group_size >= 2, std::invalid_argument, "{}: group size {} (expected >= 2)", what, group_size);
  MGBENCH_REQUIRE(w.dim() == 2 && w.size(1) % group_size == 0, std::invalid_argument,
                  "{}: a weight of shape [{}] does not split into groups of {} in-features", what,
                  fmt::join(w.sizes(), ", "), group_size);
  epsilon(w.scalar_type());  // the dtype check
  return w.view({w.size(0), w.size(1) / group_size, group_size});
}

/// Straight-through fake quantisation: forward quantises and dequantises, backward passes the
/// gradient unchanged.
class FakeQuantize : public torch::autograd::Function<FakeQuantize> {
 public:
  /// group_size 0: per token int8; otherwise per group int4.
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x, std::int64_t group_size) {
    torch::NoGradGuard no_grad;
    if (group_size == 0) {
      const double eps = epsilon(x.scalar_type());
      const torch::Tensor mn = x.amin(-1, /*keepdim=*/true);
      const torch::Tensor mx = x.amax(-1, /*keepdim=*/true);
      const torch::Tensor mn_neg = torch::min(mn, torch::zeros_like(mn));
      const torch::Tensor mx_pos = torch::max(mx, torch::zeros_like(mx));
      const torch::Tensor scale = torch::clamp((mx_pos - mn_neg) / (kInt8Max - kInt8Min), eps);
      const torch::Tensor zero_point =
          torch::clamp(torch::rsub(torch::round(mn_neg / scale), kInt8Min), kInt8Min, kInt8Max);
      return quantize_dequantize(x, scale.to(torch::kFloat32), zero_point.to(torch::kFloat32), kInt8Min, kInt8Max);
    }
    const torch::Tensor grouped = grouped_view(x, group_size, "int4 fake quantisation");
    const torch::Tensor scale = int4_group_scales(grouped);
    return quantize_dequantize(grouped, scale, torch::zeros_like(scale), kInt4Min, kInt4Max).view(x.sizes());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grad_outputs) {
    return {grad_outputs[0], torch::Tensor()};
  }
};

}  // namespace

torch::Tensor fake_quantize_per_token_int8(const torch::Tensor& x) {
  epsilon(x.scalar_type());
  MGBENCH_REQUIRE(x.dim() >= 1 && x.size(-1) > 0, std::invalid_argument,
                  "int8 fake quantisation: expected [..., features], got [{}]", fmt::join(x.sizes(), ", "));
  return FakeQuantize::apply(x, 0);
}

torch::Tensor fake_quantize_per_group_int4(const torch::Tensor& w, std::int64_t group_size) {
  grouped_view(w, group_size, "int4 fake quantisation");
  return FakeQuantize::apply(w, group_size);
}

Int4GroupWeight quantize_per_group_int4(const torch::Tensor& w, std::int64_t group_size) {
  torch::NoGradGuard no_grad;
  const torch::Tensor grouped = grouped_view(w.detach(), group_size, "int4 quantisation");
  MGBENCH_REQUIRE(!grouped.isnan().any().item<bool>(), std::invalid_argument,
                  "int4 quantisation: the weight holds NaN");
  const torch::Tensor scale = int4_group_scales(grouped);  // [out, in / G, 1]
  const torch::Tensor zero_point = torch::zeros_like(scale);
  // torch.ops.quantized_decomposed.quantize_per_channel_group (torchao's convert): zp added before rounding.
  const torch::Tensor values = grouped.mul(scale.reciprocal() * 1.0)
                                   .add(zero_point)
                                   .round()
                                   .clamp_(kInt4Min, kInt4Max)
                                   .to(torch::kInt8)
                                   .view(w.sizes());
  return {values, scale.squeeze(-1), zero_point.squeeze(-1)};
}

torch::Tensor pack_int4(const torch::Tensor& values) {
  MGBENCH_REQUIRE(values.scalar_type() == torch::kInt8 && values.dim() == 2 && values.size(1) % 2 == 0,
                  std::invalid_argument, "pack_int4: expected int8 [out, in] with in even, got {} [{}]",
                  c10::toString(values.scalar_type()), fmt::join(values.sizes(), ", "));
  MGBENCH_REQUIRE(values.numel() == 0 || (values.min().item<int>() >= -8 && values.max().item<int>() <= 7),
                  std::invalid_argument, "pack_int4: values outside [-8, 7]");
  const torch::Tensor nibbles = values.to(torch::kUInt8).bitwise_and(15).view({values.size(0), -1, 2});
  return nibbles.select(2, 0).bitwise_left_shift(4).bitwise_or(nibbles.select(2, 1)).contiguous();
}

torch::Tensor unpack_int4(const torch::Tensor& packed) {
  MGBENCH_REQUIRE(packed.scalar_type() == torch::kUInt8 && packed.dim() == 2, std::invalid_argument,
                  "unpack_int4: expected uint8 [out, in / 2], got {} [{}]", c10::toString(packed.scalar_type()),
                  fmt::join(packed.sizes(), ", "));
  // Sign-extend each nibble: (n ^ 8) - 8.
  const torch::Tensor hi = packed.bitwise_right_shift(4).to(torch::kInt8);
  const torch::Tensor lo = packed.bitwise_and(15).to(torch::kInt8);
  return torch::stack({hi.bitwise_xor(8) - 8, lo.bitwise_xor(8) - 8}, 2).view({packed.size(0), -1});
}

}  // namespace mgbench::models
