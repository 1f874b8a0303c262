// Precision modes, autocast scope and GradScaler (against torch.amp.GradScaler, tests/python/make_oracles.py).
#include <cmath>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/error.h"
#include "core/option_table.h"
#include "test_support.h"
#include "train/optim/grad_scaler.h"
#include "train/optim/optimizer.h"
#include "train/precision.h"

namespace mgbench::train {
namespace {

using axes::Dtype;
using axes::PrecisionInfo;

const PrecisionInfo& parse_precision(const std::string& name) { return axes::find_precision("precision", name); }

TEST(Precision, ParsesEveryModeAndRejectsOthers) {
  EXPECT_EQ(parse_precision("fp64").param_dtype, Dtype::kFloat64);
  EXPECT_FALSE(parse_precision("fp32").tf32);
  EXPECT_TRUE(parse_precision("tf32").tf32);
  EXPECT_EQ(parse_precision("fp16").param_dtype, Dtype::kFloat16);
  EXPECT_FALSE(parse_precision("fp16").autocast);
  EXPECT_EQ(parse_precision("bf16").param_dtype, Dtype::kBFloat16);
  const PrecisionInfo& amp16 = parse_precision("amp-fp16");
  EXPECT_TRUE(amp16.autocast && amp16.loss_scaling);
  EXPECT_EQ(amp16.param_dtype, Dtype::kFloat32);
  EXPECT_EQ(amp16.gradient_dtype(), Dtype::kFloat32);  // fp32 master weights: fp32 gradients
  EXPECT_EQ(amp16.autocast_dtype, Dtype::kFloat16);
  const PrecisionInfo& ampbf = parse_precision("amp-bf16");
  EXPECT_TRUE(ampbf.autocast && !ampbf.loss_scaling);
  EXPECT_EQ(ampbf.autocast_dtype, Dtype::kBFloat16);
  test::expect_error<ConfigError>([] { parse_precision("half"); }, {"--precision 'half'", "amp-bf16"});
  // The papers' seven at least; every row reachable by its name, and by its value.
  EXPECT_GE(axes::precision_choices().size(), 7u);
  for (const auto& row : axes::precision_choices()) {
    EXPECT_EQ(&parse_precision(std::string(row.name)), &row);
    EXPECT_EQ(&axes::precision_info(row.value), &row);
  }
}

TEST(Precision, AutocastScopeLowersMatmulAndRestores) {
  const torch::Tensor a = torch::randn({4, 4});
  {
    AutocastScope scope(parse_precision("amp-bf16"), torch::kCPU);
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat32);
  {
    AutocastScope scope(parse_precision("fp32"), torch::kCPU);  // no autocast
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat32);
  }
}

TEST(GradScaler, MatchesTorchAmpGradScaler) {
  const auto oracle = test::load_oracle_json("grad_scaler.json");
  MGBENCH_SKIP_WITHOUT_ORACLE(oracle, "grad_scaler.json");
  auto vec = [](const nlohmann::json& j) {
    std::vector<float> v;
    for (const auto& x : j) v.push_back(x.is_string() ? std::stof(x.get<std::string>()) : x.get<float>());
    return torch::tensor(v);
  };
  torch::Tensor p1 = vec(oracle["p1"]).set_requires_grad(true);
  torch::Tensor p2 = vec(oracle["p2"]).set_requires_grad(true);
  torch::optim::SGD opt({p1, p2}, torch::optim::SGDOptions(oracle["lr"].get<double>()).momentum(oracle["momentum"]));
  GradScaler scaler({oracle["init_scale"], oracle["growth_factor"], oracle["backoff_factor"],
                     oracle["growth_interval"].get<std::int64_t>(), true});
  const auto& steps = oracle["steps"];
  const auto& expected = oracle["trajectory"];
  ASSERT_EQ(steps.size(), expected.size());
  int skipped = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    opt.zero_grad();
    const torch::Tensor loss = (p1 * vec(steps[i]["g1"])).sum() + (p2 * vec(steps[i]["g2"])).sum();
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(opt);
    scaler.update();
    EXPECT_EQ(stepped, expected[i]["stepped"].get<bool>());
    skipped += stepped ? 0 : 1;
    EXPECT_EQ(scaler.get_scale(), expected[i]["scale"].get<double>());
    EXPECT_EQ(scaler.scale_tensor().item<double>(), expected[i]["scale"].get<double>());  // the copy, no sync
    EXPECT_EQ(scaler.growth_tracker(), expected[i]["growth_tracker"].get<std::int64_t>());
    EXPECT_TRUE(torch::allclose(p1.detach(), vec(expected[i]["p1"]), 1e-6, 1e-7));
    EXPECT_TRUE(torch::allclose(p2.detach(), vec(expected[i]["p2"]), 1e-6, 1e-7));
  }
  EXPECT_GE(skipped, 2);  // the sequence exercises the backoff path
}

TEST(ClipGradNorm, EqualsLibTorchsWithoutReadingTheNormBack) {
  torch::manual_seed(4);
  for (const double max_norm : {0.5, 1e3}) {  // clipping, and a bound above the norm (no change)
    std::vector<torch::Tensor> ours, theirs;
    for (const auto& shape : std::vector<std::vector<std::int64_t>>{{7, 5}, {5}, {3, 3, 2}}) {
      const torch::Tensor g = torch::randn(shape);
      ours.push_back(torch::zeros(shape).requires_grad_(true));
      theirs.push_back(torch::zeros(shape).requires_grad_(true));
      ours.back().mutable_grad() = g.clone();
      theirs.back().mutable_grad() = g.clone();
    }
    ours.push_back(torch::zeros({2}).requires_grad_(true));  // no gradient: skipped, as PyTorch
    const torch::Tensor norm = clip_grad_norm(ours, max_norm);
    const double expected = torch::nn::utils::clip_grad_norm_(theirs, max_norm);
    EXPECT_FLOAT_EQ(norm.item<float>(), static_cast<float>(expected));
    for (std::size_t i = 0; i < theirs.size(); ++i) {
      EXPECT_TRUE(torch::allclose(ours[i].grad(), theirs[i].grad(), 1e-6, 1e-7)) << max_norm << " " << i;
    }
    if (max_norm < expected) {
      std::vector<torch::Tensor> grads;
      for (std::size_t i = 0; i < theirs.size(); ++i) grads.push_back(ours[i].grad().flatten());
      EXPECT_NEAR(torch::cat(grads).norm().item<double>(), max_norm, 1e-5);
    }
  }
  EXPECT_THROW(clip_grad_norm({}, 0.0), std::invalid_argument);
}

TEST(GradScaler, MisuseIsAnError) {
  torch::Tensor p = torch::ones({2}).set_requires_grad(true);
  torch::optim::SGD opt({p}, 0.1);
  GradScaler scaler;
  EXPECT_THROW(scaler.update(), std::logic_error);
  scaler.scale(p.sum()).backward();
  scaler.unscale(opt);
  EXPECT_THROW(scaler.unscale(opt), std::logic_error);
  EXPECT_TRUE(torch::equal(p.grad(), torch::ones({2})));  // unscaled back to the true gradient
  EXPECT_THROW(GradScaler({1.0, 0.5, 0.5, 10, true}), std::invalid_argument);
  torch::Tensor h = torch::ones({2}, torch::kHalf).set_requires_grad(true);
  torch::optim::SGD opt16({h}, 0.1);
  GradScaler s16;
  s16.scale(h.sum()).backward();
  EXPECT_THROW(s16.unscale(opt16), std::invalid_argument);
}

TEST(GradScaler, DisabledIsAPassThrough) {
  torch::Tensor p = torch::ones({2}).set_requires_grad(true);
  torch::optim::SGD opt({p}, 0.5);
  GradScaler scaler({65536.0, 2.0, 0.5, 2000, false});
  const torch::Tensor loss = p.sum();
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_TRUE(torch::allclose(p.detach(), torch::full({2}, 0.5)));
}

}  // namespace
}  // namespace mgbench::train
