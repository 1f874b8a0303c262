// --strategy dp's DataParallel and the Cloneable model it needs, on CPU "devices" (the same code
// path as GPUs except for where tensors live).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/image_models.h"
#include "models/mobilenet_v2.h"
#include "train/data_parallel.h"

namespace mgbench {
namespace {

models::MobileNetV2 small_model() {
  torch::manual_seed(3);
  models::MobileNetV2 m(models::MobileNetV2Options{10, 0.25, 0.0});
  m->to(torch::kFloat64);
  return m;
}

/// The model as the image recipe hands it to DataParallel (models/image_models.h).
models::ImageClassifier classifier(const models::MobileNetV2& m) {
  return {m.ptr(), [](torch::nn::Module& net, const torch::Tensor& x) {
            return static_cast<models::MobileNetV2Impl&>(net).forward(x);
          }};
}

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

TEST(ImageModels, TheTableBuildsEveryModelWithItsOptions) {
  for (const auto& row : models::image_models()) {
    torch::manual_seed(0);
    const models::ImageClassifier c = row.value({/*num_classes=*/7, /*width_mult=*/0.25, /*dropout=*/0.0});
    ASSERT_NE(c.module, nullptr) << row.name;
    c.module->eval();
    const torch::Tensor logits = c.forward(*c.module, torch::rand({2, 1, 32, 32}));
    EXPECT_EQ(logits.sizes(), (std::vector<std::int64_t>{2, 7})) << row.name;
    auto clone = c.module->clone();  // Cloneable: --strategy dp replicates it
    EXPECT_TRUE(torch::equal(c.forward(*clone, torch::ones({1, 1, 32, 32})),
                             c.forward(*c.module, torch::ones({1, 1, 32, 32}))));
  }
  EXPECT_EQ(models::image_models().front().name, "mobilenet_v2");
}

TEST(DataParallel, RejectsAModuleElsewhere) {
  EXPECT_THROW(train::DataParallel(classifier(small_model()), {}), std::invalid_argument);
}

}  // namespace
}  // namespace mgbench
