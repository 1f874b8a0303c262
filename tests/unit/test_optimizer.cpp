// train/optimizer: FusedAdamW (torch.optim.AdamW(fused=True) through at::_fused_adamw_) against
// LibTorch's own AdamW, an independent implementation of the same update (a chain of per-tensor ops),
// and its scaled step against the GradScaler's unscale-then-step.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <sstream>
#include <vector>

#include "train/optim/grad_scaler.h"
#include "train/optim/optimizer.h"

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

/// The state's step count of parameter p.
std::int64_t step_of(const FusedAdamW& optimizer, const torch::Tensor& p) {
  return static_cast<const torch::optim::AdamWParamState&>(*optimizer.state().at(p.unsafeGetTensorImpl())).step();
}

// The loop's fused path under loss scaling (torch's GradScaler with a fused optimizer): the
// scaler's check alone, the normalisation and the loss scale divided inside the kernel, a skipped
// step decided on the device and its host counts given back afterwards -- against the unscale +
// synchronised step on the same gradients. Steps 2 and 5 have a non-finite gradient (skipped by
// both, the scale backs off).
TEST(FusedAdamW, ScaledStepsEqualUnscaleThenStepWithoutASync) {
  for (const double normalisation : {0.25, 1.0 / 3.0}) {  // exact in binary, and not
    auto synced_params = parameters(torch::kFloat32);
    auto fused_params = clones(synced_params, torch::kFloat32);
    FusedAdamW synced(synced_params, options()), fused(fused_params, options());
    GradScaler synced_scaler({1024.0, 2.0, 0.5, 3, true}), fused_scaler({1024.0, 2.0, 0.5, 3, true});
    torch::manual_seed(2);
    int skipped = 0;
    for (int s = 0; s < 8; ++s) {
      SCOPED_TRACE(testing::Message() << "normalisation " << normalisation << ", step " << s);
      const double loss_scale = synced_scaler.get_scale();
      ASSERT_EQ(loss_scale, fused_scaler.get_scale());
      synced_scaler.scale(torch::ones({}));  // the scale on the device, as after a scaled loss
      fused_scaler.scale(torch::ones({}));
      for (std::size_t i = 0; i < synced_params.size(); ++i) {
        torch::Tensor g = torch::randn(synced_params[i].sizes()) * loss_scale;  // what a scaled backward leaves
        if ((s == 2 || s == 5) && i == 2) g[0][1] = std::numeric_limits<float>::infinity();
        synced_params[i].mutable_grad() = g.clone();
        fused_params[i].mutable_grad() = g.clone();
      }
      // The loop's old path: the normalisation as a pass over the gradients, unscale, a host sync.
      for (auto& p : synced_params) p.mutable_grad().mul_(normalisation);
      const bool stepped = synced_scaler.step(synced);
      synced_scaler.update();
      // The fused path.
      const torch::Tensor found_inf = fused_scaler.check(fused);
      fused.step_scaled(fused_scaler.scale_tensor() / normalisation, found_inf);
      fused_scaler.update();
      EXPECT_EQ(found_inf.item<float>() == 0.0F, stepped);
      if (!stepped) {
        fused.undo_step();
        EXPECT_THROW(fused.undo_step(), std::logic_error);  // one undo per step
        ++skipped;
      }
      for (std::size_t i = 0; i < synced_params.size(); ++i) {
        if (normalisation == 0.25) {
          EXPECT_TRUE(torch::equal(fused_params[i], synced_params[i])) << "parameter " << i;
        } else {  // g / (S / n) vs (g n) / S: an ulp apart, not more
          EXPECT_TRUE(torch::allclose(fused_params[i], synced_params[i], 1e-6, 1e-7)) << "parameter " << i;
        }
        EXPECT_EQ(step_of(fused, fused_params[i]), step_of(synced, synced_params[i])) << "parameter " << i;
      }
    }
    EXPECT_EQ(skipped, 2);
    EXPECT_EQ(step_of(fused, fused_params[0]), 6);
    // The parameters moved.
    EXPECT_FALSE(torch::allclose(fused_params[2], parameters(torch::kFloat32)[2], 1e-3, 1e-3));
  }
  // A rank whose shards have no gradient still follows the others' skip: nothing to give back.
  FusedAdamW idle({torch::zeros({2}).requires_grad_(true)}, options());
  idle.step_scaled({}, torch::ones({}));
  EXPECT_NO_THROW(idle.undo_step());
  EXPECT_THROW(idle.undo_step(), std::logic_error);
}

}  // namespace
}  // namespace mgbench::train
