// The training loop with a recipe of its own (a linear regression in fp64), on one rank: gradient
// accumulation under both loss normalisations, the recipe's per-step metrics table, and a step whose
// gradients are non-finite from a finite loss.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cmath>

#include "core/error.h"
#include "linear_recipe.h"
#include "results/reader.h"
#include "test_support.h"

namespace mgbench {
namespace {

using test::LinearRecipe;
using train::LossNormalization;

struct Result {
  torch::Tensor parameters;
  results::RunRecord run;
};

Result train(LinearRecipe& recipe, std::int64_t batch_size, std::int64_t grad_accum, const std::string& results) {
  train::TrainOptions t = test::linear_options(results);
  t.optim.optimizer = train::OptimizerKind::kSgd;
  t.optim.momentum = 0;
  t.epochs = 2;
  t.batch_size = batch_size;
  t.grad_accum = grad_accum;
  const torch::Tensor parameters = test::train_linear(recipe, t, MPI_COMM_SELF);
  return {parameters, results::read_runs(results).back()};
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
