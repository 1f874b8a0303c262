// ResNet-50 against torchvision's resnet50 (tests/python/make_oracles.py writes the oracle files):
// names, shapes, counts, initialisation, logits, loss, gradients, running statistics; its layouts,
// FSDP units and options.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "models/image_models.h"
#include "models/resnet.h"
#include "models/state_dict.h"
#include "test_support.h"

namespace mgbench::models {
namespace {

/// |a - b| / |b| (Frobenius norms): a tensor's relative difference as a whole.
double relative_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).norm() / b.norm()).item<double>();
}

/// max_i |a_i - b_i| / max(|b_i|, 1e-3 max |b|): each entry's relative difference, entries near 0
/// measured against b's scale.
double max_relative_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs() / b.abs().clamp_min(1e-3 * b.abs().max().item<double>())).max().item<double>();
}

/// Records a measured difference in the test's XML output (--gtest_output=xml) and checks it.
void expect_below(const std::string& what, double diff, double tolerance) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", diff);
  testing::Test::RecordProperty(what, text);
  EXPECT_LT(diff, tolerance) << what;
}

std::int64_t parameter_count(torch::nn::Module& model) {
  std::int64_t count = 0;
  for (const auto& p : model.parameters()) count += p.numel();
  return count;
}

TEST(ResNet, HasTorchvisionsParameterCountsAndBatchNormCounters) {
  ResNet imagenet(ResNetOptions{1000});
  EXPECT_EQ(parameter_count(*imagenet), 25'557'032);  // torchvision.models.resnet50()
  ResNet mnist;
  EXPECT_EQ(parameter_count(*mnist), 25'557'032 - 2048 * 990 - 990);
  int counters = 0;
  for (const auto& b : mnist->named_buffers()) {
    if (!b.key().ends_with("num_batches_tracked")) continue;
    ++counters;
    EXPECT_EQ(b.value().scalar_type(), torch::kInt64) << b.key();
  }
  EXPECT_EQ(counters, 53);  // 1 stem + 16 blocks x 3 + 4 downsample BatchNorms
}

TEST(ResNet, NamesShapesAndCountEqualTorchvision) {
  const auto oracle = test::load_oracle_json("resnet50_names.json");
  MGBENCH_SKIP_WITHOUT_ORACLE(oracle, "resnet50_names.json");
  ASSERT_EQ(oracle.size(), 2u);
  for (const auto& [tag, expected] : oracle.items()) {
    ResNet model(ResNetOptions{expected["num_classes"].get<std::int64_t>()});
    const auto state = state_dict(*model);
    ASSERT_EQ(state.size(), expected["tensors"].size()) << tag;
    for (const auto& [name, shape] : expected["tensors"].items()) {
      ASSERT_EQ(state.count(name), 1u) << tag << ": missing " << name;
      EXPECT_EQ(state.at(name).sizes().vec(), shape.get<std::vector<std::int64_t>>()) << tag << ": " << name;
    }
    std::vector<std::string> names;
    for (const auto& p : model->named_parameters()) names.push_back(p.key());
    EXPECT_EQ(parameter_count(*model), expected["parameters"].get<std::int64_t>()) << tag;
    EXPECT_EQ(names, expected["parameter_names"].get<std::vector<std::string>>()) << tag << ": registration order";
  }
}

TEST(ResNet, InitialisationEqualsTorchvisionsForTheSameSeed) {
  const std::string path = test::oracle_dir() + "/resnet50.pt";
  MGBENCH_REQUIRE_INPUTS(path);
  const auto expected = read_torch_state_dict(path);  // torch.manual_seed(0); resnet50(num_classes=10)
  torch::manual_seed(0);
  ResNet model;
  const auto state = state_dict(*model);
  ASSERT_EQ(state.size(), expected.size());
  for (const auto& [name, tensor] : state) {
    // Same modules, drawn in the same order from the same generator: bit for bit.
    EXPECT_TRUE(torch::equal(tensor, expected.at(name))) << name;
  }
}

/// The oracle's weights in an fp64 model.
ResNet torchvision_model() {
  ResNet model;
  model->to(torch::kFloat64);
  const auto path = test::oracle_dir() + "/resnet50.pt";
  load_state_dict(*model, read_torch_state_dict(path), path);
  return model;
}

TEST(ResNet, ForwardGradientsAndStatisticsEqualTorchvision) {
  const std::string io_path = test::oracle_dir() + "/resnet50_io.pt";
  MGBENCH_REQUIRE_INPUTS(io_path);
  const auto io = read_torch_state_dict(io_path);
  // fp64 throughout: the tolerances are rounding of fp64 sums in another order, not fp32's.
  for (const std::string item : {"rgb", "gray"}) {  // [2, 3 or 1, 64, 64]; torchvision saw gray replicated
    const std::string c = item + ".";
    ResNet model = torchvision_model();
    const torch::Tensor x = io.at(c + "input");
    {
      torch::NoGradGuard no_grad;
      model->eval();
      expect_below(c + "eval_logits", relative_diff(model->forward(x), io.at(c + "eval_logits")), 1e-10);
    }
    model->train();  // batch statistics
    const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), io.at("labels"));
    expect_below(c + "train_loss", max_relative_diff(loss, io.at(c + "train_loss")), 1e-12);
    loss.backward();
    std::vector<torch::Tensor> norms;
    for (const auto& p : model->parameters()) norms.push_back(p.grad().norm());
    // Each parameter's gradient norm to 1e-10 of it (or of the largest, for a small one).
    expect_below(c + "grad_norms", max_relative_diff(torch::stack(norms), io.at(c + "grad_norms")), 1e-10);
    const auto params = model->named_parameters();
    for (const std::string name : {"conv1.weight", "bn1.bias", "layer1.0.downsample.0.weight", "layer2.0.conv2.weight",
                                   "fc.weight", "fc.bias"}) {
      expect_below(c + "grad." + name, relative_diff(params[name].grad(), io.at(c + "grad." + name)), 1e-10);
    }
    const auto buffers = model->named_buffers();
    for (const std::string name :
         {"bn1.running_mean", "layer1.0.downsample.1.running_var", "layer4.2.bn3.running_mean"}) {
      expect_below(c + name, relative_diff(buffers[name], io.at(c + "after_train." + name)), 1e-10);
    }
    EXPECT_TRUE(torch::equal(buffers["layer4.2.bn3.num_batches_tracked"],
                             io.at(c + "after_train.layer4.2.bn3.num_batches_tracked")));
  }
}

TEST(ResNet, ChannelsLastGivesTheSameResultOnOneAndThreeChannels) {
  // fp64, so that the comparison sees the layouts and not fp32's summation orders; 32 px, where
  // layer4 runs on 1 x 1 feature maps (layout-ambiguous activations).
  torch::manual_seed(3);
  ResNet nchw, nhwc;
  nchw->to(torch::kFloat64);
  nhwc->to(torch::kFloat64);
  load_state_dict(*nhwc, state_dict(*nchw), "nchw model");
  to_channels_last(*nhwc);
  for (const auto& p : nhwc->named_parameters()) {
    const torch::Tensor& w = p.value();
    if (w.dim() != 4) continue;
    const std::vector<std::int64_t> expected{w.size(1) * w.size(2) * w.size(3), 1, w.size(3) * w.size(1), w.size(1)};
    EXPECT_EQ(w.strides().vec(), expected) << p.key() << " " << w.sizes();
  }
  for (const std::int64_t channels : {1, 3}) {
    nchw->zero_grad();
    nhwc->zero_grad();
    const torch::Tensor x = torch::rand({4, channels, 32, 32}, torch::kFloat64);
    const torch::Tensor a = nchw->forward(x);
    const torch::Tensor b = nhwc->forward(x.contiguous(torch::MemoryFormat::ChannelsLast));
    const std::string tag = "channels_last." + std::to_string(channels) + "ch.";
    expect_below(tag + "logits", relative_diff(b, a), 1e-10);
    // A squared loss: a plain sum's gradient is constant over the batch, which batch norm removes.
    a.square().sum().backward();
    b.square().sum().backward();
    const auto expected = nchw->named_parameters();
    double largest = 0.0;
    for (const auto& p : expected) largest = std::max(largest, p.value().grad().norm().item<double>());
    double worst = 0.0;
    std::string worst_name;
    for (const auto& p : nhwc->named_parameters()) {
      const torch::Tensor& g_nchw = expected[p.key()].grad();
      const double relative =
          ((p.value().grad() - g_nchw).norm() / g_nchw.norm().clamp_min(1e-3 * largest)).item<double>();
      if (relative >= worst) std::tie(worst, worst_name) = std::pair(relative, p.key());
    }
    // 4e-11 measured (50 layers of train-mode BatchNorm over 4 values at layer4 amplify fp64's
    // rounding); a layout error would be of order 1.
    expect_below(tag + "worst_gradient." + worst_name, worst, 1e-9);
  }
}

/// Records the units' entries and exits, passing tensors through.
class RecordingHooks : public UnitHooks {
 public:
  torch::Tensor before_forward(int unit, const torch::Tensor& input) override {
    calls.push_back(unit);
    return input;
  }
  torch::Tensor after_forward(int unit, const torch::Tensor& output) override {
    calls.push_back(-1 - unit);
    return output;
  }
  std::vector<int> calls;  // unit entered: unit; left: -1 - unit
};

TEST(ResNet, FsdpUnitsHoldEveryParameterOnceAndAreEnteredInForwardOrder) {
  ResNet model;
  const std::vector<ParameterUnit> units = model->parameter_units();
  ASSERT_EQ(units.size(), 17u);  // the root and 16 Bottleneck blocks
  EXPECT_EQ(units[0].name, "root");
  EXPECT_FALSE(units[0].reshard_after_forward);
  EXPECT_EQ(units[0].names,
            (std::vector<std::string>{"conv1.weight", "bn1.weight", "bn1.bias", "fc.weight", "fc.bias"}));
  EXPECT_EQ(units[1].name, "layer1.0");
  EXPECT_EQ(units[16].name, "layer4.2");
  const auto params = model->named_parameters();
  std::set<const c10::TensorImpl*> seen;
  std::size_t listed = 0;
  for (const ParameterUnit& u : units) {
    ASSERT_EQ(u.names.size(), u.parameters.size()) << u.name;
    for (std::size_t k = 0; k < u.names.size(); ++k) {
      ASSERT_NE(params.find(u.names[k]), nullptr) << u.name << ": " << u.names[k];
      EXPECT_TRUE(params[u.names[k]].is_same(u.parameters[k])) << u.names[k];
      EXPECT_TRUE(seen.insert(u.parameters[k].unsafeGetTensorImpl()).second) << u.names[k] << " in two units";
      if (u.name != "root") {
        EXPECT_TRUE(u.names[k].starts_with(u.name + ".")) << u.names[k] << " in " << u.name;
      }
      ++listed;
    }
  }
  EXPECT_EQ(listed, params.size());
  RecordingHooks hooks;
  model->set_unit_hooks(&hooks);
  model->eval();
  torch::NoGradGuard no_grad;
  model->forward(torch::rand({1, 1, 32, 32}));
  std::vector<int> expected{0};
  for (int unit = 1; unit <= 16; ++unit) expected.insert(expected.end(), {unit, -1 - unit});
  expected.insert(expected.end(), {0, -1});  // the root again for fc, left at the end
  EXPECT_EQ(hooks.calls, expected);
}

const ImageModelInfo& resnet50_row() {
  const auto rows = image_models();
  const auto row = std::find_if(rows.begin(), rows.end(), [](const ImageModelInfo& r) { return r.name == "resnet50"; });
  if (row == rows.end()) throw std::logic_error("no resnet50 row in image_models()");
  return *row;
}

TEST(ResNet, TheTableRowTakesTheRecipesOptionsAndRefusesAWidth) {
  const ImageModelInfo& row = resnet50_row();
  test::expect_error<std::invalid_argument>(
      [&] {
        row.value({10, /*width_mult=*/0.5, 0.0, false});
      },
      {"--width-mult", "0.5", "resnet50"});
  EXPECT_FALSE(row.scales_width);  // the image recipe refuses another --width-mult with the options (test_cli)
  EXPECT_THROW({ ResNet no_classes(ResNetOptions{0}); }, std::invalid_argument);
  EXPECT_THROW({ ResNet empty_stage(ResNetOptions{10, {3, 0, 6, 3}}); }, std::invalid_argument);
  // The recipe's defaults: dropout 0.2 (ResNet has none: ignored); BatchNorm frozen on request.
  torch::manual_seed(0);
  const std::shared_ptr<ImageClassifier> c =
      row.value({/*num_classes=*/7, /*width_mult=*/1.0, /*dropout=*/0.2, /*freeze=*/true});
  c->module().train();
  for (const auto& m : c->module().modules(false)) {
    if (m->as<torch::nn::BatchNorm2d>() != nullptr) {
      EXPECT_FALSE(m->is_training()) << "BatchNorm not frozen";
    }
  }
  c->module().eval();
  const torch::Tensor x = torch::rand({2, 1, 32, 32});
  const torch::Tensor logits = c->forward(x);
  EXPECT_EQ(logits.sizes(), (std::vector<std::int64_t>{2, 7}));
  auto clone = c->clone_classifier();  // Cloneable: --strategy dp replicates it
  EXPECT_TRUE(torch::equal(clone->forward(x), logits));
}

}  // namespace
}  // namespace mgbench::models
