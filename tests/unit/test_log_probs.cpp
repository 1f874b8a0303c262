// models::target_log_probs (chunked, recomputed in backward) against the expression it replaces,
// log_softmax(linear(h, W).float()).gather(targets), with autograd's gradients.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

#include "models/log_probs.h"

namespace mgbench {
namespace {

struct Case {
  torch::Tensor value, grad_hidden, grad_weight;
};

Case run(bool fused, torch::ScalarType dtype, std::int64_t chunk_elements, bool weight_grad = true,
         models::FrozenHeadGradient frozen = models::FrozenHeadGradient::kAuto) {
  torch::manual_seed(11);
  torch::Tensor hidden = torch::randn({10, 5}, torch::kFloat64).to(dtype).requires_grad_(true);
  torch::Tensor weight = torch::randn({7, 5}, torch::kFloat64).to(dtype).requires_grad_(weight_grad);
  const torch::Tensor targets = torch::randint(0, 7, {10}, torch::kInt64);
  const torch::Tensor upstream = torch::randn({10}, torch::kFloat32);
  const torch::Tensor value = fused ? models::target_log_probs(hidden, weight, targets, chunk_elements, frozen)
                                    : torch::nn::functional::linear(hidden, weight)
                                          .to(torch::kFloat32)
                                          .log_softmax(-1)
                                          .gather(1, targets.unsqueeze(1))
                                          .squeeze(1);
  (value * upstream).sum().backward();
  return {value.detach(), hidden.grad(), weight_grad ? weight.grad() : torch::Tensor()};
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

TEST(TargetLogProbs, EqualsLogSoftmaxOfTheFullLogitsWithItsGradients) {
  // 3 rows per chunk (21 elements / vocabulary 7): chunk boundaries inside the 10 rows. The softmax is
  // fp32 whatever the inputs' dtype (log_softmax vs logits - logsumexp: a few fp32 ulps apart).
  for (const auto& [dtype, tolerance] : {std::pair{torch::kFloat64, 2e-6}, std::pair{torch::kFloat32, 2e-6}}) {
    const Case fused = run(true, dtype, 21);
    const Case plain = run(false, dtype, 21);
    EXPECT_EQ(fused.value.scalar_type(), torch::kFloat32);
    EXPECT_LT(max_diff(fused.value, plain.value), tolerance);
    EXPECT_LT(max_diff(fused.grad_hidden, plain.grad_hidden), tolerance);
    EXPECT_LT(max_diff(fused.grad_weight, plain.grad_weight), tolerance);
    EXPECT_EQ(fused.grad_hidden.scalar_type(), dtype);
    // One chunk for all rows gives the same.
    EXPECT_LT(max_diff(run(true, dtype, 1 << 20).value, fused.value), tolerance);
  }
  // bf16 logits, as a bf16 model's head computes them; the softmax in fp32.
  const Case fused = run(true, torch::kBFloat16, 21);
  const Case plain = run(false, torch::kBFloat16, 21);
  EXPECT_LT(max_diff(fused.value, plain.value), 1e-5);
  EXPECT_LT(max_diff(fused.grad_hidden, plain.grad_hidden), 2e-2);
  EXPECT_LT(max_diff(fused.grad_weight, plain.grad_weight), 2e-2);
}

TEST(TargetLogProbs, AFrozenHeadGetsNoGradientAndShapesAreChecked) {
  // The input's gradient from the factor computed in forward (the default for a frozen head) and
  // from logits recomputed in backward, both against autograd's (the softmax is fp32 whatever the
  // inputs' dtype: a few fp32 ulps apart).
  for (const auto& [dtype, tolerance] : {std::pair{torch::kFloat64, 2e-6}, std::pair{torch::kFloat32, 2e-6}}) {
    const Case plain = run(false, dtype, 21, /*weight_grad=*/false);
    for (const auto how : {models::FrozenHeadGradient::kAuto, models::FrozenHeadGradient::kRecompute}) {
      const Case fused = run(true, dtype, 21, /*weight_grad=*/false, how);
      EXPECT_LT(max_diff(fused.value, plain.value), 2e-6);
      EXPECT_LT(max_diff(fused.grad_hidden, plain.grad_hidden), tolerance) << static_cast<int>(how);
      EXPECT_EQ(fused.grad_hidden.scalar_type(), dtype);
      EXPECT_FALSE(fused.grad_weight.defined());
    }
  }
  // bf16: the factor's softmax product in bf16, as the recomputed path's logits gradient.
  const Case plain = run(false, torch::kBFloat16, 21, /*weight_grad=*/false);
  const Case factor = run(true, torch::kBFloat16, 21, /*weight_grad=*/false);
  EXPECT_LT(max_diff(factor.grad_hidden, plain.grad_hidden), 2e-2);
  const Case fused = factor;
  EXPECT_THROW(models::target_log_probs(torch::zeros({4, 5}), torch::zeros({7, 6}), torch::zeros({4}, torch::kInt64)),
               std::invalid_argument);
}

}  // namespace
}  // namespace mgbench
