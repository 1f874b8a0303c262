// --strategy dp's DataParallel and the Cloneable model it needs, on CPU "devices" (the same code
// path as GPUs except for where tensors live).
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>
#include <thread>
#include <tuple>

#include "models/image_classifier.h"
#include "models/image_models.h"
#include "models/mobilenet_v2.h"
#include "train/precision.h"
#include "train/recipes/data_parallel.h"

namespace mgbench {
namespace {

models::MobileNetV2 small_model() {
  torch::manual_seed(3);
  models::MobileNetV2 m(models::MobileNetV2Options{10, 0.25, 0.0});
  m->to(torch::kFloat64);
  return m;
}

/// The model as the image recipe hands it to DataParallel (models/image_classifier.h).
std::shared_ptr<models::ImageClassifier> classifier(const models::MobileNetV2& m) { return m.ptr(); }

/// Records, on entering the first block (once a forward), the autocast state, grad mode and thread.
struct RecordingHooks : models::UnitHooks {
  std::mutex mutex;
  std::vector<std::tuple<bool, bool, std::thread::id>> seen;
  torch::Tensor before_forward(int unit, const torch::Tensor& input) override {
    if (unit == 1) {
      std::lock_guard<std::mutex> lock(mutex);
      seen.emplace_back(at::autocast::is_autocast_enabled(torch::kCPU), torch::GradMode::is_enabled(),
                        std::this_thread::get_id());
    }
    return input;
  }
  torch::Tensor after_forward(int, const torch::Tensor& output) override { return output; }
};

TEST(MobileNetV2, CloneIsADeepCopyWithTheSameFunction) {
  models::MobileNetV2 m = small_model();
  m->eval();
  auto copy = std::dynamic_pointer_cast<models::MobileNetV2Impl>(m->clone());
  ASSERT_NE(copy, nullptr);
  copy->eval();
  const torch::Tensor x = torch::rand({3, 1, 32, 32}, torch::kFloat64);
  EXPECT_TRUE(torch::equal(m->forward(x), copy->forward(x)));
  // Deep: changing the copy leaves the original alone.
  torch::NoGradGuard no_grad;
  copy->parameters().front().add_(1.0);
  EXPECT_FALSE(torch::equal(m->parameters().front(), copy->parameters().front()));
  EXPECT_EQ(m->named_parameters().keys(), copy->named_parameters().keys());
}

TEST(DataParallel, TwoReplicasEqualOneModelOnTheWholeBatch) {
  models::MobileNetV2 reference = small_model();
  models::MobileNetV2 model = small_model();
  reference->set_batchnorm_frozen(true);  // per-sample maths: chunking the batch changes nothing
  model->set_batchnorm_frozen(true);
  reference->train();
  model->train();
  train::DataParallel dp(classifier(model), {torch::kCPU, torch::kCPU});
  const torch::Tensor x = torch::rand({6, 1, 32, 32}, torch::kFloat64);
  const torch::Tensor labels = torch::tensor({1, 2, 3, 4, 5, 6});
  const torch::Tensor out = dp.forward(x);
  const torch::Tensor expected = reference->forward(x);
  EXPECT_LT((out - expected).abs().max().item<double>(), 1e-12);
  torch::nn::functional::cross_entropy(out, labels).backward();
  torch::nn::functional::cross_entropy(expected, labels).backward();
  const auto a = model->parameters();
  const auto b = reference->parameters();
  double max_diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].grad().defined()) << i;  // gradients reach the module through the replicas
    max_diff = std::max(max_diff, (a[i].grad() - b[i].grad()).abs().max().item<double>());
  }
  EXPECT_LT(max_diff, 1e-12);
}

TEST(DataParallel, KeepsTheFirstReplicasBatchNormStatistics) {
  models::MobileNetV2 model = small_model();
  models::MobileNetV2 first_chunk_only = small_model();
  model->train();
  first_chunk_only->train();
  train::DataParallel dp(classifier(model), {torch::kCPU, torch::kCPU});
  const torch::Tensor x = torch::rand({4, 1, 32, 32}, torch::kFloat64);
  dp.forward(x);
  first_chunk_only->forward(x.narrow(0, 0, 2));
  const auto a = model->buffers();
  const auto b = first_chunk_only->buffers();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-12, 1e-12)) << i;
}

TEST(DataParallel, EveryReplicaRunsUnderTheCallersAutocast) {
  // LibTorch's parallel_apply runs replicas on at::parallel_for threads without the caller's
  // thread-local state: replica 1 ran in fp32 and cat promoted the bf16 half silently.
  torch::manual_seed(3);
  models::MobileNetV2 model(models::MobileNetV2Options{10, 0.25, 0.0});
  model->set_batchnorm_frozen(true);
  model->train();
  train::DataParallel dp(classifier(model), {torch::kCPU, torch::kCPU});
  const torch::Tensor x = torch::rand({4, 1, 32, 32});
  torch::Tensor out, expected;
  {
    const train::AutocastScope autocast(axes::precision_info(axes::Precision::kAmpBf16), torch::kCPU);
    out = dp.forward(x);
    expected = model->forward(x.narrow(0, 2, 2));  // the replica's chunk, on the model itself
  }
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(out.narrow(0, 2, 2), expected));  // the replica computed in bf16 as the model does
  EXPECT_EQ(dp.forward(x).scalar_type(), torch::kFloat32);   // and outside autocast in fp32
  // Each replica sees the caller's autocast state and grad mode, on a thread of its own: the unit
  // hooks record them, and the replicas share them (clone copies the pointer).
  RecordingHooks hooks;
  model->set_unit_hooks(&hooks);
  train::DataParallel recorded(classifier(model), {torch::kCPU, torch::kCPU, torch::kCPU});
  {
    const train::AutocastScope autocast(axes::precision_info(axes::Precision::kAmpBf16), torch::kCPU);
    torch::NoGradGuard no_grad;
    recorded.forward(torch::rand({3, 1, 32, 32}));
  }
  model->set_unit_hooks(nullptr);
  const auto& seen = hooks.seen;
  ASSERT_EQ(seen.size(), 3u);
  for (const auto& [autocast, grad, thread] : seen) {
    EXPECT_TRUE(autocast);
    EXPECT_FALSE(grad);
  }
  EXPECT_NE(std::get<2>(seen[0]), std::get<2>(seen[1]));
  EXPECT_NE(std::get<2>(seen[1]), std::get<2>(seen[2]));
}

TEST(DataParallel, ReplicatesOnceFollowsEveryUpdateAndLeavesTheRngAlone) {
  models::MobileNetV2 reference = small_model();
  models::MobileNetV2 model = small_model();
  for (auto* m : {&reference, &model}) {
    (*m)->set_batchnorm_frozen(true);
    (*m)->train();
  }
  train::DataParallel dp(classifier(model), {torch::kCPU, torch::kCPU, torch::kCPU});
  torch::optim::SGD sgd_dp(model->parameters(), torch::optim::SGDOptions(0.5));
  torch::optim::SGD sgd_ref(reference->parameters(), torch::optim::SGDOptions(0.5));
  const torch::Tensor x = torch::rand({6, 1, 32, 32}, torch::kFloat64);
  const torch::Tensor labels = torch::tensor({1, 2, 3, 4, 5, 6});
  for (int step = 0; step < 3; ++step) {
    sgd_dp.zero_grad();
    sgd_ref.zero_grad();
    torch::manual_seed(11);
    const torch::Tensor out = dp.forward(x);
    const double draw = torch::rand({1}).item<double>();
    torch::manual_seed(11);
    EXPECT_EQ(draw, torch::rand({1}).item<double>()) << "step " << step << ": a forward consumed the CPU RNG";
    const torch::Tensor expected = reference->forward(x);
    // Step 1 and 2: the replicas run the parameters the optimizer just changed.
    EXPECT_LT((out - expected).abs().max().item<double>(), 1e-12) << "step " << step;
    torch::nn::functional::cross_entropy(out, labels).backward();
    torch::nn::functional::cross_entropy(expected, labels).backward();
    sgd_dp.step();
    sgd_ref.step();
  }
  EXPECT_EQ(dp.replicas(), 2u);
  // Fewer samples than devices: only as many replicas run.
  EXPECT_EQ(dp.forward(x.narrow(0, 0, 2)).size(0), 2);
  // The replicas follow the model's mode (eval: BatchNorm uses the running statistics).
  model->eval();
  reference->eval();
  EXPECT_LT((dp.forward(x) - reference->forward(x)).abs().max().item<double>(), 1e-12);
}

TEST(ImageModels, TheTableBuildsEveryModelWithItsOptions) {
  for (const auto& row : models::image_models()) {
    torch::manual_seed(0);
    // resnet50 has torchvision's fixed widths (it refuses any other --width-mult).
    const double width_mult = row.name == "resnet50" ? 1.0 : 0.25;
    const std::shared_ptr<models::ImageClassifier> c = row.value({/*num_classes=*/7, width_mult, /*dropout=*/0.0});
    ASSERT_NE(c, nullptr) << row.name;
    c->module().eval();
    const torch::Tensor logits = c->forward(torch::rand({2, 1, 32, 32}));
    EXPECT_EQ(logits.sizes(), (std::vector<std::int64_t>{2, 7})) << row.name;
    auto clone = c->clone_classifier();  // Cloneable: --strategy dp replicates it
    const torch::Tensor ones = torch::ones({1, 1, 32, 32});
    EXPECT_TRUE(torch::equal(clone->forward(ones), c->forward(ones)));
    // --channels-last: every convolution weight NHWC, the same logits to rounding.
    clone->to_channels_last();
    for (const auto& p : clone->module().parameters()) {
      EXPECT_TRUE(p.dim() != 4 || p.is_contiguous(torch::MemoryFormat::ChannelsLast)) << row.name;
    }
    EXPECT_TRUE(torch::allclose(clone->forward(ones), c->forward(ones), 1e-4, 1e-5)) << row.name;
    // --freeze-batchnorm: in train() BatchNorm uses its running statistics and leaves them as they are,
    // so a sample's logits do not depend on the rest of its batch.
    const auto frozen = row.value({7, width_mult, 0.0, /*freeze_batchnorm=*/true});
    frozen->module().train();
    const torch::Tensor x = torch::rand({4, 1, 32, 32});
    const torch::Tensor all = frozen->forward(x);
    EXPECT_TRUE(torch::allclose(all.narrow(0, 0, 1), frozen->forward(x.narrow(0, 0, 1)), 1e-5, 1e-6)) << row.name;
    for (const auto& b : frozen->module().named_buffers()) {
      if (b.key().ends_with("running_mean")) {
        EXPECT_EQ(b.value().abs().sum().item<double>(), 0.0) << row.name << " " << b.key();
      }
    }
  }
  EXPECT_EQ(models::image_models().front().name, "mobilenet_v2");
}

TEST(DataParallel, RejectsAModuleElsewhere) {
  EXPECT_THROW(train::DataParallel(classifier(small_model()), {}), std::invalid_argument);
}

}  // namespace
}  // namespace mgbench
