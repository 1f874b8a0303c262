// train/optimizer: FusedAdamW (torch.optim.AdamW(fused=True) through at::_fused_adamw_) against
// LibTorch's own AdamW, an independent implementation of the same update (a chain of per-tensor ops).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>
#include <vector>

#include "train/optimizer.h"

namespace mgbench::train {
namespace {

/// Parameters of several shapes (a scalar, a matrix, a non-square one), seeded.
std::vector<torch::Tensor> parameters(torch::ScalarType dtype) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> out;
  for (const auto& shape : std::vector<std::vector<std::int64_t>>{{}, {7}, {16, 32}, {3, 5, 2}}) {
    out.push_back(torch::randn(shape, torch::kFloat64).to(dtype).set_requires_grad(true));
  }
  return out;
}

std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& params, torch::ScalarType dtype) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().to(dtype).clone().set_requires_grad(true));
  return out;
}

/// Step `steps` times with the same seeded gradients on every optimizer's parameters; parameter 1
/// has no gradient in step 2 (its step count then lags the others', as in torch).
void train(std::vector<std::pair<torch::optim::Optimizer*, std::vector<torch::Tensor>*>> runs, int steps, int seed) {
  torch::manual_seed(seed);
  for (int s = 0; s < steps; ++s) {
    std::vector<torch::Tensor> grads;
    for (const auto& p : *runs.front().second) grads.push_back(torch::randn(p.sizes(), torch::kFloat64));
    for (auto& [optimizer, params] : runs) {
      for (std::size_t i = 0; i < params->size(); ++i) {
        auto& p = (*params)[i];
        p.mutable_grad() = (s == 2 && i == 1) ? torch::Tensor() : grads[i].to(p.scalar_type());
      }
      optimizer->step();
    }
  }
}

torch::optim::AdamWOptions options() { return torch::optim::AdamWOptions(1e-2).weight_decay(0.01); }

TEST(FusedAdamW, EqualsLibTorchsAdamWInFp64) {
  auto fused_params = parameters(torch::kFloat64);
  auto chain_params = clones(fused_params, torch::kFloat64);
  FusedAdamW fused(fused_params, options());
  torch::optim::AdamW chain(chain_params, options());
  train({{&fused, &fused_params}, {&chain, &chain_params}}, 6, 11);
  for (std::size_t i = 0; i < fused_params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(fused_params[i], chain_params[i], 1e-12, 1e-14)) << "parameter " << i;
    const auto& a =
        static_cast<const torch::optim::AdamWParamState&>(*fused.state().at(fused_params[i].unsafeGetTensorImpl()));
    const auto& b =
        static_cast<const torch::optim::AdamWParamState&>(*chain.state().at(chain_params[i].unsafeGetTensorImpl()));
    EXPECT_EQ(a.step(), b.step()) << "parameter " << i;
    EXPECT_EQ(a.step(), i == 1 ? 5 : 6);
    EXPECT_TRUE(torch::allclose(a.exp_avg_sq(), b.exp_avg_sq(), 1e-12, 1e-16)) << "parameter " << i;
  }
  // The parameters moved: the comparison is not of two untouched copies.
  EXPECT_FALSE(torch::allclose(fused_params[2], parameters(torch::kFloat64)[2], 1e-3, 1e-3));
}

TEST(FusedAdamW, Bf16UpdatesRoundOnceAndStayCloserToFp64ThanTheOpChain) {
  const auto start = parameters(torch::kFloat64);
  auto reference = clones(start, torch::kFloat64);
  auto fused_params = clones(start, torch::kBFloat16);
  auto chain_params = clones(start, torch::kBFloat16);
  torch::optim::AdamW exact(reference, options());
  FusedAdamW fused(fused_params, options());
  torch::optim::AdamW chain(chain_params, options());
  train({{&exact, &reference}, {&fused, &fused_params}, {&chain, &chain_params}}, 20, 5);
  double fused_error = 0, chain_error = 0;
  for (std::size_t i = 0; i < start.size(); ++i) {
    EXPECT_EQ(fused_params[i].scalar_type(), torch::kBFloat16);
    fused_error += (fused_params[i].to(torch::kFloat64) - reference[i]).abs().sum().item<double>();
    chain_error += (chain_params[i].to(torch::kFloat64) - reference[i]).abs().sum().item<double>();
  }
  EXPECT_LE(fused_error, chain_error) << "fused " << fused_error << ", op chain " << chain_error;
}

TEST(FusedAdamW, ACheckpointResumesBitwiseAndLoadsIntoLibTorchsAdamW) {
  auto params = parameters(torch::kFloat32);
  FusedAdamW optimizer(params, options());
  train({{&optimizer, &params}}, 3, 7);
  std::stringstream saved;
  {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    archive.save_to(saved);
  }
  auto resumed_params = clones(params, torch::kFloat32);
  FusedAdamW resumed(resumed_params, options());
  auto chain_params = clones(params, torch::kFloat32);
  torch::optim::AdamW chain(chain_params, options());
  for (torch::optim::Optimizer* o :
       {static_cast<torch::optim::Optimizer*>(&resumed), static_cast<torch::optim::Optimizer*>(&chain)}) {
    std::stringstream copy(saved.str());
    torch::serialize::InputArchive archive;
    archive.load_from(copy);
    o->load(archive);
  }
  train({{&optimizer, &params}, {&resumed, &resumed_params}, {&chain, &chain_params}}, 3, 9);
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], resumed_params[i])) << "parameter " << i;
    EXPECT_TRUE(torch::allclose(params[i], chain_params[i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

TEST(FusedAdamW, AGradientUnlikeItsParameterIsRefused) {
  auto params = parameters(torch::kFloat32);
  FusedAdamW optimizer(params, options());
  params[2].mutable_grad() = torch::zeros({16, 32}, torch::kFloat64);
  EXPECT_THROW(optimizer.step(), c10::Error);
}

}  // namespace
}  // namespace mgbench::train
