#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "models/mobilenet_v2.h"
#include "models/state_dict.h"
#include "test_support.h"

namespace mgbench::models {
namespace {

TEST(MobileNetV2, MakeDivisibleAsTorchvision) {
  EXPECT_EQ(make_divisible(32 * 1.0, 8), 32);
  EXPECT_EQ(make_divisible(32 * 0.5, 8), 16);
  EXPECT_EQ(make_divisible(32 * 0.25, 8), 8);
  EXPECT_EQ(make_divisible(16 * 0.35, 8), 8);
  EXPECT_EQ(make_divisible(1280 * 1.4, 8), 1792);
  EXPECT_EQ(make_divisible(24 * 0.75, 8), 24);  // 18 -> 16 would be > 10 % below
}

TEST(MobileNetV2, NamesShapesAndCountEqualTorchvision) {
  const auto oracle = test::load_oracle_json("mobilenet_names.json");
  MGBENCH_SKIP_WITHOUT_ORACLE(oracle, "mobilenet_names.json");
  for (const auto& [tag, expected] : oracle.items()) {
    MobileNetV2 model(MobileNetV2Options{10, expected["width"].get<double>()});
    const auto state = state_dict(*model);
    ASSERT_EQ(state.size(), expected["tensors"].size()) << tag;
    for (const auto& [name, shape] : expected["tensors"].items()) {
      ASSERT_EQ(state.count(name), 1u) << tag << ": missing " << name;
      EXPECT_EQ(state.at(name).sizes().vec(), shape.get<std::vector<std::int64_t>>()) << tag << ": " << name;
    }
    std::int64_t count = 0;
    std::vector<std::string> names;
    for (const auto& p : model->named_parameters()) {
      count += p.value().numel();
      names.push_back(p.key());
    }
    EXPECT_EQ(count, expected["parameters"].get<std::int64_t>()) << tag;
    EXPECT_EQ(names, expected["parameter_names"].get<std::vector<std::string>>()) << tag << ": registration order";
  }
}

/// Loads the torchvision weights of one width into an fp64 mgbench model.
MobileNetV2 torchvision_model(const std::string& tag, double width) {
  MobileNetV2 model(MobileNetV2Options{10, width});
  model->to(torch::kFloat64);
  const auto path = test::oracle_dir() + "/mobilenet_" + tag + ".pt";
  load_state_dict(*model, read_torch_state_dict(path), path);
  return model;
}

TEST(MobileNetV2, ForwardAndGradientsEqualTorchvisionOnGrayscale) {
  MGBENCH_REQUIRE_INPUTS(test::oracle_dir() + "/mobilenet_w1_io.pt");
  for (const auto& [tag, width] :
       std::vector<std::pair<std::string, double>>{{"w1", 1.0}, {"w0.5", 0.5}, {"w0.25", 0.25}}) {
    MobileNetV2 model = torchvision_model(tag, width);
    const auto io = read_torch_state_dict(test::oracle_dir() + "/mobilenet_" + tag + "_io.pt");
    const torch::Tensor x = io.at("input");  // [4, 1, 64, 64] fp64; torchvision saw it replicated to 3 channels
    {
      torch::NoGradGuard no_grad;
      model->eval();
      const torch::Tensor logits = model->forward(x);
      EXPECT_TRUE(torch::allclose(logits, io.at("eval_logits"), /*rtol=*/1e-10, /*atol=*/1e-12))
          << tag << " max diff " << (logits - io.at("eval_logits")).abs().max().item<double>();
    }
    // Train mode: batch statistics, dropout off. The 1-channel stem must give the gradients of
    // the 3-channel stem on the replicated image.
    MobileNetV2 train_model(MobileNetV2Options{10, width, /*dropout=*/0.0});
    train_model->to(torch::kFloat64);
    load_state_dict(*train_model, state_dict(*model), "eval model");
    train_model->train();
    const torch::Tensor loss = torch::nn::functional::cross_entropy(train_model->forward(x), io.at("labels"));
    EXPECT_NEAR(loss.item<double>(), io.at("train_loss").item<double>(), 1e-12) << tag;
    loss.backward();
    const auto params = train_model->named_parameters();
    for (const std::string name : {"features.0.0.weight", "features.1.conv.0.0.weight", "classifier.1.weight"}) {
      const torch::Tensor g = params[name].grad();
      const torch::Tensor expected = io.at("grad." + name);
      EXPECT_TRUE(torch::allclose(g, expected, 1e-9, 1e-12))
          << tag << " " << name << " max diff " << (g - expected).abs().max().item<double>();
    }
  }
}

TEST(StateDict, ToDeviceCastsOnlyFloatingPointTensorsAsPythonsModuleTo) {
  MobileNetV2 model(MobileNetV2Options{10, 0.25});
  to_device(*model, torch::kCPU, torch::kFloat64);
  int counters = 0;
  for (const auto& b : model->named_buffers()) {
    const bool counter = b.key().ends_with("num_batches_tracked");
    counters += counter ? 1 : 0;
    EXPECT_EQ(b.value().scalar_type(), counter ? torch::kInt64 : torch::kFloat64) << b.key();
  }
  EXPECT_EQ(counters, 52);  // torchvision's mobilenet_v2 has 52 BatchNorm layers
  for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat64);
}

TEST(StateDict, MismatchesNameTheTensor) {
  MobileNetV2 model(MobileNetV2Options{10, 0.25});
  auto state = state_dict(*model);
  auto missing = state;
  missing.erase("classifier.1.bias");
  test::expect_error<DataError>([&] { load_state_dict(*model, missing, "weights.pt"); },
                                {"weights.pt", "classifier.1.bias"});
  auto wrong = state;
  wrong["classifier.1.weight"] = torch::zeros({3, 3});
  EXPECT_THROW(load_state_dict(*model, wrong, "weights.pt"), DataError);
  auto extra = state;
  extra["head.weight"] = torch::zeros({1});
  EXPECT_THROW(load_state_dict(*model, extra, "weights.pt"), DataError);
  EXPECT_THROW(read_torch_state_dict("/nonexistent.pt"), DataError);
}

}  // namespace
}  // namespace mgbench::models

namespace mgbench::models {
namespace {

TEST(MobileNetV2, ChannelsLastGivesTheSameResult) {
  torch::manual_seed(3);
  MobileNetV2 nchw(MobileNetV2Options{10, 0.5, 0.0});
  MobileNetV2 nhwc(MobileNetV2Options{10, 0.5, 0.0});
  load_state_dict(*nhwc, state_dict(*nchw), "nchw model");
  to_channels_last(*nhwc);
  // Every convolution weight with the strides Python's module.to(memory_format=torch.channels_last)
  // gives it, (C*kH*kW, 1, kW*C, C) -- also the depthwise ones [C, 1, 3, 3], which are contiguous in
  // both layouts and kept NCHW strides under contiguous(): PyTorch then ran their convolutions
  // through oneDNN's NCHW kernels (a GEMM weight gradient: 7 % of a 32 px step).
  int depthwise = 0;
  for (const auto& p : nhwc->named_parameters()) {
    const torch::Tensor& w = p.value();
    if (w.dim() != 4) continue;
    const std::vector<std::int64_t> expected{w.size(1) * w.size(2) * w.size(3), 1, w.size(3) * w.size(1), w.size(1)};
    EXPECT_EQ(w.strides().vec(), expected) << p.key() << " " << w.sizes();
    depthwise += w.size(1) == 1 ? 1 : 0;
  }
  EXPECT_EQ(depthwise, 17) << "depthwise convolutions checked";
  const torch::Tensor x = torch::rand({4, 1, 48, 48});
  const torch::Tensor a = nchw->forward(x);
  const torch::Tensor b = nhwc->forward(x.contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(torch::allclose(a, b, 1e-4, 1e-5)) << (a - b).abs().max().item<double>();
  a.sum().backward();
  b.sum().backward();
  const auto g_nchw = nchw->named_parameters()["features.0.0.weight"].grad();
  const auto g_nhwc = nhwc->named_parameters()["features.0.0.weight"].grad();
  // fp32 sums over B x H x W in another order: compare relative to the gradient's norm.
  const double relative = ((g_nchw - g_nhwc).norm() / g_nchw.norm()).item<double>();
  EXPECT_LT(relative, 1e-4) << "|g| = " << g_nchw.norm().item<double>();
}

TEST(MobileNetV2, ChannelsLastGivesTheSameGradientsOnOneByOneFeatureMaps) {
  // 32 px: the last blocks run on 1 x 1 feature maps, where the activations' layout is ambiguous
  // too. In fp64, because batch norm over 4 x 1 x 1 values amplifies fp32 rounding (1e-3 relative).
  torch::manual_seed(5);
  MobileNetV2 nchw(MobileNetV2Options{10, 0.5, 0.0});
  MobileNetV2 nhwc(MobileNetV2Options{10, 0.5, 0.0});
  nchw->to(torch::kFloat64);
  nhwc->to(torch::kFloat64);
  load_state_dict(*nhwc, state_dict(*nchw), "nchw model");
  to_channels_last(*nhwc);
  const torch::Tensor x = torch::rand({4, 1, 32, 32}, torch::kFloat64);
  // A squared loss: the gradient of a plain sum is constant over the batch, which train-mode batch
  // norm removes (zero up to rounding in every layer before the last batch norm).
  nchw->forward(x).square().sum().backward();
  nhwc->forward(x.contiguous(torch::MemoryFormat::ChannelsLast)).square().sum().backward();
  const auto expected = nchw->named_parameters();
  double largest = 0.0;
  for (const auto& p : expected) largest = std::max(largest, p.value().grad().norm().item<double>());
  int compared = 0;
  for (const auto& p : nhwc->named_parameters()) {
    const torch::Tensor& g = p.value().grad();
    const torch::Tensor& g_nchw = expected[p.key()].grad();
    // The biases of the batch norms before a projection have gradients of zero up to rounding (the
    // next batch norm removes a constant shift): relative to at least 1e-3 of the largest gradient.
    const double relative = ((g - g_nchw).norm() / g_nchw.norm().clamp_min(1e-3 * largest)).item<double>();
    EXPECT_LT(relative, 1e-10) << p.key() << " |g| = " << g_nchw.norm().item<double>();
    ++compared;
  }
  EXPECT_EQ(compared, 158);
}

}  // namespace
}  // namespace mgbench::models
