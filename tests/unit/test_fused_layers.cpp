// The decoder layer's fused autograd nodes (issue 47, item 3) against the chains of ATen ops they
// replace, forward and backward, in float64 on the CPU: a difference there is a wrong formula,
// not rounding.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include <optional>
#include <string>
#include <vector>

#include "models/fake_quant.h"
#include "models/llama.h"
#include "models/lora.h"
#include "models/nf4.h"
#include "test_support.h"

namespace mgbench::models {
namespace {

/// Max |a - b| relative to max |b|, in float64.
double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor b64 = b.to(torch::kFloat64);
  return ((a.to(torch::kFloat64) - b64).abs().max() / b64.abs().max().clamp_min(1e-300)).item<double>();
}

struct ProjectionCase {
  std::string name;
  bool adapter = true;
  bool train_base = false;  // full fine-tuning: the base weight trains, no adapter
  double dropout = 0.0;
  std::int64_t fake_quant_group = 0;
};

/// The layer as a chain of ATen ops, as LoraLinear computed it before its fused node:
/// linear(base_input(x), base_weight()) + lora_b(lora_a(dropout(x)) * scaling).
torch::Tensor chain(LoraLinearImpl& layer, const torch::Tensor& x) {
  torch::Tensor y = torch::nn::functional::linear(layer.base_input(x), layer.base_weight());
  if (layer.has_lora() && layer.adapter_enabled) {
    const torch::Tensor dropped = torch::nn::functional::dropout(
        x, torch::nn::functional::DropoutFuncOptions().p(layer.dropout->options.p()).training(layer.is_training()));
    y = y + torch::nn::functional::linear(torch::nn::functional::linear(dropped, layer.lora_a->weight) * layer.scaling,
                                          layer.lora_b->weight);
  }
  return y;
}

/// One layer's output and the gradients of x and every parameter that trains, for y.backward(g).
std::vector<torch::Tensor> output_and_gradients(LoraLinearImpl& layer, const torch::Tensor& x0, const torch::Tensor& g,
                                                bool fused) {
  for (auto& p : layer.parameters()) p.mutable_grad() = torch::Tensor();
  const torch::Tensor x = x0.clone().requires_grad_(true);
  torch::manual_seed(7);  // the same dropout masks on both paths
  const torch::Tensor y = fused ? layer.forward(x) : chain(layer, x);
  y.backward(g);
  std::vector<torch::Tensor> out{y.detach(), x.grad()};
  for (const auto& p : layer.parameters()) {
    if (p.requires_grad()) out.push_back(p.grad());
  }
  return out;
}

TEST(Projection, EqualsTheChainOfLinearLayersInFloat64ForwardAndBackward) {
  const std::vector<ProjectionCase> cases{{"base only, frozen", false},
                                          {"full fine-tuning", false, true},
                                          {"LoRA", true},
                                          {"LoRA, dropout 0.3", true, false, 0.3},
                                          {"QAT LoRA (fake quantisation)", true, false, 0.0, 32},
                                          {"full QAT", false, true, 0.0, 32}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    torch::manual_seed(3);
    const test::DefaultDtype f64(torch::kFloat64);
    LoraLinear layer(64, 48);
    {
      torch::NoGradGuard no_grad;
      layer->weight.normal_(0.0, 0.2);
    }
    if (c.adapter) {
      layer->enable_lora(4, 12.0, c.dropout);  // scaling 3: not a power of two
      torch::NoGradGuard no_grad;
      layer->lora_b->weight.normal_(0.0, 0.2);
    } else {
      layer->weight.set_requires_grad(c.train_base);
    }
    if (c.fake_quant_group > 0) layer->enable_fake_quant(c.fake_quant_group);
    const torch::Tensor x = torch::randn({2, 5, 64}, torch::kFloat64);
    const torch::Tensor g = torch::randn({2, 5, 48}, torch::kFloat64);
    const auto fused = output_and_gradients(*layer, x, g, true);
    const auto expected = output_and_gradients(*layer, x, g, false);
    ASSERT_EQ(fused.size(), expected.size());
    EXPECT_EQ(fused.size(), c.adapter ? 4u : c.train_base ? 3u : 2u);  // y, x's and the trained parameters'
    for (std::size_t i = 0; i < fused.size(); ++i) {
      ASSERT_TRUE(fused[i].defined()) << i;
      EXPECT_EQ(fused[i].sizes(), expected[i].sizes()) << i;
      EXPECT_EQ(fused[i].scalar_type(), torch::kFloat64) << i;
      EXPECT_LT(relative_difference(fused[i], expected[i]), 1e-13) << i;
    }
    if (!c.train_base && !c.adapter) continue;
    // One autograd node between the output and the leaves (and fake quantisation's nodes).
    const torch::Tensor y = layer->forward(x.clone().requires_grad_(true));
    EXPECT_NE(y.grad_fn()->name().find("Projection"), std::string::npos) << y.grad_fn()->name();
  }
}

TEST(Projection, DisabledAdapterAndInputsWithoutGradients) {
  torch::manual_seed(4);
  const test::DefaultDtype f64(torch::kFloat64);
  LoraLinear layer(32, 16);
  {
    torch::NoGradGuard no_grad;
    layer->weight.normal_();
  }
  layer->enable_lora(2, 4.0, 0.0);
  {
    torch::NoGradGuard no_grad;
    layer->lora_b->weight.normal_();
  }
  const torch::Tensor x = torch::randn({3, 32}, torch::kFloat64);
  layer->adapter_enabled = false;
  EXPECT_LT(relative_difference(layer->forward(x), torch::matmul(x, layer->weight.t())), 1e-15);
  layer->adapter_enabled = true;
  // x without grad (the embedding is frozen): only the adapter's gradients.
  const torch::Tensor y = layer->forward(x);
  y.sum().backward();
  EXPECT_TRUE(layer->lora_a->weight.grad().defined());
  EXPECT_TRUE(layer->lora_b->weight.grad().defined());
  EXPECT_FALSE(layer->weight.grad().defined());
  // Under no-grad: no graph.
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(layer->forward(x.clone().requires_grad_(true)).requires_grad());
  EXPECT_THROW(layer->forward(torch::randn({3, 31}, torch::kFloat64)), std::invalid_argument);
}

TEST(Projection, Nf4BaseEqualsTheChainOnItsDequantisedWeight) {
  torch::manual_seed(5);
  const test::DefaultDtype f32(torch::kFloat32);
  LoraLinear layer(128, 128, BaseWeights::kNf4);
  layer->quantize_base(torch::randn({128, 128}) * 0.1);
  layer->enable_lora(8, 16.0, 0.0);
  {
    torch::NoGradGuard no_grad;
    layer->lora_b->weight.normal_(0.0, 0.1);
  }
  const torch::Tensor w = layer->nf4.dequantize().to(torch::kFloat64);
  const torch::Tensor x0 = torch::randn({4, 128}), g = torch::randn({4, 128});
  const torch::Tensor x = x0.clone().requires_grad_(true);
  const torch::Tensor y = layer->forward(x);
  y.backward(g);
  // The chain in float64 on the dequantised weight.
  const torch::Tensor x64 = x0.to(torch::kFloat64).requires_grad_(true);
  const torch::Tensor a64 = layer->lora_a->weight.detach().to(torch::kFloat64).requires_grad_(true);
  const torch::Tensor b64 = layer->lora_b->weight.detach().to(torch::kFloat64).requires_grad_(true);
  const torch::Tensor y64 = torch::matmul(x64, w.t()) + torch::matmul(torch::matmul(x64, a64.t()) * 2.0, b64.t());
  y64.backward(g.to(torch::kFloat64));
  EXPECT_LT(relative_difference(y, y64), 1e-5);
  EXPECT_LT(relative_difference(x.grad(), x64.grad()), 1e-5);
  EXPECT_LT(relative_difference(layer->lora_a->weight.grad(), a64.grad()), 1e-5);
  EXPECT_LT(relative_difference(layer->lora_b->weight.grad(), b64.grad()), 1e-5);
}

// Autocast (amp-bf16 on the CPU): the fused node computes in the autocast dtype, as the chain does,
// and the gradients reach the float32 parameters in float32.
TEST(Projection, UnderAutocastComputesInItsDtypeAndGivesParametersTheirDtype) {
  torch::manual_seed(6);
  LoraLinear layer(64, 32);
  {
    torch::NoGradGuard no_grad;
    layer->weight.normal_(0.0, 0.2);
  }
  layer->enable_lora(4, 8.0, 0.0);
  {
    torch::NoGradGuard no_grad;
    layer->lora_b->weight.normal_(0.0, 0.2);
  }
  const torch::Tensor x = torch::randn({6, 64});
  const torch::Tensor g = torch::randn({6, 32}).to(torch::kBFloat16);
  std::vector<torch::Tensor> runs[2];
  for (const bool fused : {true, false}) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    auto out = output_and_gradients(*layer, x, g, fused);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    runs[fused ? 0 : 1] = std::move(out);
  }
  ASSERT_EQ(runs[0].size(), 4u);
  EXPECT_EQ(runs[0][0].scalar_type(), torch::kBFloat16);
  for (std::size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_EQ(runs[0][i].scalar_type(), runs[1][i].scalar_type()) << i;
    EXPECT_LT(relative_difference(runs[0][i], runs[1][i]), 2e-2) << i;  // bf16: 8 bits of mantissa
  }
}

/// HF's LlamaRMSNorm as autograd's chain of ops (what LlamaRMSNormImpl computed before its node).
torch::Tensor rms_norm_chain(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor h = x.to(torch::kFloat32);
  return weight * (h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type());
}

TEST(RmsNorm, EqualsTheChainOfOpsForwardAndBackward) {
  // float64: the formula; float32 and bf16 (bf16 weights, as --precision bf16): within rounding.
  for (const auto dtype : {torch::kFloat64, torch::kFloat32, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const double tolerance = dtype == torch::kFloat64 ? 1e-13 : dtype == torch::kFloat32 ? 1e-5 : 2e-2;
    torch::manual_seed(8);
    LlamaRMSNorm norm(48, 1e-5);
    norm->to(dtype);
    {
      torch::NoGradGuard no_grad;
      norm->weight.normal_(1.0, 0.3);
    }
    const torch::Tensor x0 = (torch::randn({2, 7, 48}) * 3).to(dtype), g = torch::randn({2, 7, 48}).to(dtype);
    std::vector<torch::Tensor> runs[2];
    for (const bool fused : {true, false}) {
      norm->weight.mutable_grad() = torch::Tensor();
      const torch::Tensor x = x0.clone().requires_grad_(true);
      // The fp64 chain computes in fp64 (x.to(kFloat32) would round it): the node's float64 path.
      const torch::Tensor y = fused ? norm->forward(x)
                              : dtype == torch::kFloat64
                                  ? norm->weight * (x * torch::rsqrt(x.pow(2).mean(-1, true) + 1e-5))
                                  : rms_norm_chain(x, norm->weight, 1e-5);
      y.backward(g);
      runs[fused ? 0 : 1] = {y.detach(), x.grad(), norm->weight.grad()};
    }
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(runs[0][i].scalar_type(), dtype) << i;
      EXPECT_LT(relative_difference(runs[0][i], runs[1][i]), tolerance) << i;
    }
  }
}

}  // namespace
}  // namespace mgbench::models
