// The training loop with a recipe of its own (a linear regression in fp64), on one rank: gradient
// accumulation under both loss normalisations, the recipe's per-step metrics table, and a step whose
// gradients are non-finite from a finite loss.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cmath>

#include "core/error.h"
#include "core/progress.h"
#include "results/reader.h"
#include "results/writer.h"
#include "runtime/mpi_communicator.h"
#include "test_support.h"
#include "train/loop.h"

namespace mgbench {
namespace {

using train::LossNormalization;

/// y = 0.5 * sum(x) + 0.1 on 32 fixed points, fitted by a Linear(4, 1) in fp64 (no randomness
/// after the initial weights, which the loop's --seed fixes). sqrt_at_zero: the loss adds
/// sum(sqrt(0 * error)), 0 in forward, whose backward divides by 2 sqrt(0) (torch's sqrt
/// derivative, grad / (2 result)): gradients NaN from a finite loss, as a norm of a zero vector.
class LinearRecipe final : public train::Recipe {
 public:
  explicit LinearRecipe(LossNormalization normalization, bool sqrt_at_zero = false)
      : normalization_(normalization), sqrt_at_zero_(sqrt_at_zero) {}

  void declare(options::OptionTable&) override {}
  void validate(const train::TrainOptions&) const override {}
  void setup(const train::RecipeContext&) override {
    model_ = torch::nn::Linear(4, 1);
    model_->to(torch::kFloat64);
    x_ = torch::linspace(-1, 1, 32 * 4, torch::kFloat64).reshape({32, 4}).sin();
    y_ = x_.sum(1, /*keepdim=*/true) * 0.5 + 0.1;
  }
  std::int64_t train_size() const override { return 32; }
  data::Batch assemble(const data::PlannedBatch& plan, bool) const override {
    const torch::Tensor index = torch::tensor(plan.indices, torch::kInt64);
    data::Batch batch;
    batch.tensors = {x_.index_select(0, index), y_.index_select(0, index)};
    batch.samples = static_cast<std::int64_t>(plan.indices.size());
    return batch;
  }
  torch::nn::Module& model() override { return *model_; }
  std::vector<torch::Tensor> trainable_parameters() override { return model_->parameters(); }
  std::vector<std::pair<std::string, torch::Tensor>> checkpoint_tensors() override {
    std::vector<std::pair<std::string, torch::Tensor>> all;
    for (const auto& p : model_->named_parameters()) all.emplace_back(p.key(), p.value());
    return all;
  }
  LossNormalization loss_normalization() const override { return normalization_; }
  train::MicroBatchLoss forward(const data::Batch& batch) override {
    const torch::Tensor error = (model_->forward(batch.tensors[0]) - batch.tensors[1]).pow(2);
    const torch::Tensor metrics = torch::stack({error.mean().detach(), torch::full({}, 7.0, error.options())});
    const torch::Tensor extra = sqrt_at_zero_ ? (error * 0).sqrt().sum() : torch::zeros({}, error.options());
    if (normalization_ == LossNormalization::kMeanPerMicroBatch) return {error.mean() + extra, 1.0, metrics};
    return {error.sum() + extra, static_cast<double>(batch.samples), metrics};
  }
  std::vector<std::string> metric_names() const override { return {"mse", "seven"}; }
  h5::Attributes attributes() const override { return {}; }

 private:
  LossNormalization normalization_;
  bool sqrt_at_zero_;
  torch::nn::Linear model_{nullptr};
  torch::Tensor x_, y_;
};

struct Result {
  torch::Tensor parameters;
  results::RunRecord run;
};

Result train(LinearRecipe& recipe, std::int64_t batch_size, std::int64_t grad_accum, const std::string& results) {
  train::TrainOptions t;
  t.device = runtime::DeviceRequest::kCpu;
  t.optim.optimizer = train::OptimizerKind::kSgd;
  t.optim.momentum = 0;
  t.optim.lr = 0.1;
  t.optim.lr_schedule = train::LrSchedule::kConstant;
  t.epochs = 2;
  t.batch_size = batch_size;
  t.grad_accum = grad_accum;
  t.shuffle = false;
  t.threads = 1;
  t.results = results;
  runtime::MpiCommunicator comm(MPI_COMM_SELF);
  train::TrainingLoop loop(t, recipe, comm, {}, {});
  results::ResultsWriter writer(results, MPI_COMM_SELF, "linear", loop.run_attributes(), loop.rank_attributes(),
                                loop.layout());
  Progress quiet(false, "img/s");
  train::RunControl control;
  loop.run(writer, quiet, control);
  writer.finish(results::kStatusCompleted);
  std::vector<torch::Tensor> flat;
  for (const auto& p : recipe.trainable_parameters()) flat.push_back(p.detach().reshape({-1}).clone());
  return {torch::cat(flat), results::read_runs(results).back()};
}

TEST(TrainingLoop, GradientAccumulationEqualsTheWholeBatchUnderBothNormalisations) {
  test::TempDir dir;
  for (const auto normalization : {LossNormalization::kMeanPerMicroBatch, LossNormalization::kSumOverTargets}) {
    LinearRecipe a(normalization), b(normalization), c(normalization);
    const Result accumulated = train(a, 4, 2, dir.file("a.h5"));
    const Result whole = train(b, 8, 1, dir.file("b.h5"));
    const Result smaller = train(c, 4, 1, dir.file("c.h5"));  // twice the steps: other weights
    const double diff = (accumulated.parameters - whole.parameters).abs().max().item<double>();
    EXPECT_LT(diff, 1e-12) << static_cast<int>(normalization);
    EXPECT_GT((smaller.parameters - whole.parameters).abs().max().item<double>(), 1e-6);
    ASSERT_EQ(accumulated.run.epochs[0].size(), 2u);
    EXPECT_EQ(accumulated.run.epochs[0][0].steps, 4);  // 32 samples / (4 x 2) per step
    EXPECT_EQ(accumulated.run.epochs[0][0].samples, 32);
  }
}

TEST(TrainingLoop, RecordsTheRecipesMetricsPerStep) {
  test::TempDir dir;
  LinearRecipe recipe(LossNormalization::kMeanPerMicroBatch);
  const Result r = train(recipe, 4, 2, dir.file("m.h5"));
  EXPECT_EQ(r.run.metric_names, (std::vector<std::string>{"mse", "seven"}));
  ASSERT_EQ(r.run.metrics.size(), 1u);
  ASSERT_EQ(r.run.metrics[0].size(), 8u);  // 2 epochs x 4 steps
  double mse_sum = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.run.metrics[0][i][1], 7.0);  // the mean over a step's micro-batches of a constant
    mse_sum += r.run.metrics[0][i][0];
  }
  // The loss of a step is the mean of its micro-batches' mean errors, as the metric: the epoch's
  // mean loss is the mean of the metric over its steps.
  EXPECT_NEAR(mse_sum / 4, r.run.epochs[0][0].loss_mean, 1e-14);
  EXPECT_LT(r.run.metrics[0][7][0], r.run.metrics[0][0][0]);  // it learns
}

// On the CPU the summed gradients are checked before the update (train/step.cpp): a finite loss
// with NaN gradients stops the step without updating, and its rerun names the backward's op.
TEST(TrainingLoop, NonFiniteGradientsFromAFiniteLossStopTheStepBeforeTheUpdateAndNameTheBackwardsOp) {
  test::TempDir dir;
  for (const auto normalization : {LossNormalization::kMeanPerMicroBatch, LossNormalization::kSumOverTargets}) {
    LinearRecipe recipe(normalization, /*sqrt_at_zero=*/true);
    test::expect_error<Error>(
        [&] { train(recipe, 4, 2, dir.file("nan.h5")); },
        {"gradients became non-finite (loss ", "at epoch 1 step 1 ", "the gradient of weight was non-finite",
         "this step's backward: aten::div.Tensor made inf in Double from finite inputs",
         "(not compared in float64: it computes in float64 already)",
         "before this run's first update, so the learning rate is not the cause"});
    for (const auto& p : recipe.trainable_parameters()) {
      EXPECT_TRUE(torch::isfinite(p).all().item<bool>());  // no update took the NaN in
      EXPECT_TRUE(p.grad().isnan().any().item<bool>());    // the step's own gradients, as backward left them
    }
  }
}

}  // namespace
}  // namespace mgbench
