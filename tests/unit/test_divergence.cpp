// train/divergence: the first op that makes a non-finite value from finite inputs, observed with
// at::RecordFunction, and the verdict of its float64 rerun; the cause a divergence error states.
// The oracle for each op's values is PyTorch's own arithmetic (IEEE float32 / float64).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>

#include "train/divergence.h"

namespace mgbench::train {
namespace {

using InFloat64 = NonFiniteOrigin::InFloat64;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Divergence, NamesTheProjectionThatOverflowsAndItsWeight) {
  torch::nn::Linear fc(4, 3);
  torch::NoGradGuard no_grad;
  fc->weight.fill_(1e38);  // each output sums four products of 1e38: 4e38, beyond float32's 3.4e38
  const std::optional<NonFiniteOrigin> origin = first_non_finite_op(
      [&] {
        fc->forward(torch::ones({2, 4}));
      },
      {{"fc.weight", fc->weight}});
  ASSERT_TRUE(origin.has_value());
  EXPECT_EQ(origin->op.rfind("aten::addmm", 0), 0u) << origin->op;  // linear's GEMM, not linear (it ends later)
  EXPECT_TRUE(has(origin->inputs, "(fc.weight)")) << origin->inputs;
  EXPECT_FALSE(origin->nan);
  EXPECT_EQ(origin->output_dtype, "Float");
  EXPECT_DOUBLE_EQ(origin->input_max_abs, static_cast<double>(1e38f));
  ASSERT_EQ(origin->float64, InFloat64::kFinite) << origin->not_run;
  EXPECT_NEAR(origin->float64_max_abs, 4.0 * static_cast<double>(1e38f), 1e31);
  EXPECT_DOUBLE_EQ(origin->dtype_max, static_cast<double>(std::numeric_limits<float>::max()));

  DivergenceFacts facts;
  facts.origin = origin;
  const std::string at_start = divergence_cause(facts, 0, 1e-3);
  EXPECT_TRUE(has(at_start, "an overflow")) << at_start;
  EXPECT_TRUE(has(at_start, "the learning rate is not the cause")) << at_start;
  EXPECT_FALSE(has(at_start, "--lr")) << at_start;
  const std::string later = divergence_cause(facts, 7, 1e-3);
  EXPECT_TRUE(has(later, "after 7 update(s)") && has(later, "lower --lr (now 0.001)")) << later;
}

TEST(Divergence, AnOpThatOverflowsOnTheWayToAResultInRangeIsStillAnOverflow) {
  // The Euclidean norm of two 2e38: float32's kernel squares them on the way (4e76: inf), while
  // the norm itself, 2.83e38, is representable (torch.hypot gives it in float32).
  const std::optional<NonFiniteOrigin> origin =
      first_non_finite_op([] { torch::full({2}, 2e38, torch::kFloat32).norm(); }, {});
  ASSERT_TRUE(origin.has_value());
  EXPECT_EQ(origin->op.rfind("aten::linalg_vector_norm", 0), 0u) << origin->op;
  ASSERT_EQ(origin->float64, InFloat64::kFinite) << origin->not_run;
  EXPECT_NEAR(origin->float64_max_abs, std::sqrt(2.0) * static_cast<double>(2e38f), 1e31);
  DivergenceFacts facts;
  facts.origin = origin;
  const std::string cause = divergence_cause(facts, 12, 0.1);
  EXPECT_TRUE(has(cause, "an overflow inside the op")) << cause;
  EXPECT_TRUE(has(cause, "lower --lr (now 0.1)")) << cause;
}

TEST(Divergence, AnOpNonFiniteFromModerateInputsWhereFloat64IsInRangeIsAKernelDefect) {
  // What a defective kernel leaves (the oneDNN channels-last case of issue 50): no op of this CPU
  // shows one, so the observation is written out as first_non_finite_op reports it.
  NonFiniteOrigin o;
  o.op = "aten::native_batch_norm";
  o.inputs = "Float[2, 16, 1, 1] |x|<=5.1";
  o.output_dtype = "Float";
  o.nan = true;
  o.input_max_abs = 5.1;
  o.dtype_max = static_cast<double>(std::numeric_limits<float>::max());
  o.float64 = InFloat64::kFinite;
  o.float64_max_abs = 12.3;
  DivergenceFacts facts;
  facts.origin = o;
  const std::string cause = divergence_cause(facts, 12, 0.1);
  EXPECT_TRUE(has(cause, "aten::native_batch_norm made NaN in Float from finite inputs")) << cause;
  EXPECT_TRUE(has(cause, "a defect of this Float kernel, not the learning rate")) << cause;
  EXPECT_FALSE(has(cause, "lower --lr")) << cause;
}

TEST(Divergence, AnOpInFloat64AlreadyIsNotComparedThroughTheOpAroundIt) {
  // --precision fp64: a projection of 1e308 overflows float64 itself in aten::mm, inside
  // aten::matmul and aten::linear, which must not be "compared in float64" as a domain error.
  const torch::Tensor w = torch::full({3, 4}, 1e308, torch::kFloat64);
  const std::optional<NonFiniteOrigin> origin = first_non_finite_op(
      [&] {
        torch::linear(torch::ones({2, 4}, torch::kFloat64), w);
      },
      {});
  ASSERT_TRUE(origin.has_value());
  EXPECT_EQ(origin->op, "aten::mm");
  EXPECT_EQ(origin->float64, InFloat64::kNotRun);
  EXPECT_EQ(origin->not_run, "it computes in float64 already");
  EXPECT_TRUE(origin->compared_through.empty()) << origin->compared_through;
}

TEST(Divergence, ADomainErrorIsNonFiniteInFloat64Too) {
  const std::optional<NonFiniteOrigin> origin = first_non_finite_op(
      [] {
        torch::log(torch::tensor({0.5f, 2.0f}) * 0);
      },
      {});  // log(0) = -inf
  ASSERT_TRUE(origin.has_value());
  EXPECT_EQ(origin->op, "aten::log");
  EXPECT_EQ(origin->float64, InFloat64::kNonFinite);
  DivergenceFacts facts;
  facts.origin = origin;
  EXPECT_TRUE(has(divergence_cause(facts, 0, 1.0), "in float64 too: the op's domain"));
}

TEST(Divergence, OpsOnNonFiniteInputsOrNonFiniteScalarsAreNotTheOrigin) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // NaN in, NaN out: made before the observed ops.
  EXPECT_FALSE(first_non_finite_op([&] { torch::tensor({1.0f, nan}) + 1; }, {}).has_value());
  // A causal mask: -inf written on purpose, from a non-finite scalar.
  EXPECT_FALSE(first_non_finite_op(
                   [] {
                     torch::zeros({3, 3}).masked_fill(torch::ones({3, 3}, torch::kBool).triu(1),
                                                      -std::numeric_limits<double>::infinity());
                   },
                   {})
                   .has_value());
  // A NaN written on purpose: no op's making.
  EXPECT_FALSE(first_non_finite_op([&] { torch::zeros({64}).fill_(nan); }, {}).has_value());
  // Memory not yet written is no op's result (the empty and resize family): a tensor of no elements
  // grown again within its storage shows the NaN it held, from no value at all.
  torch::Tensor regrown = torch::full({4}, nan);
  regrown.resize_({0});
  EXPECT_FALSE(first_non_finite_op([&] { regrown.resize_({4}); }, {}).has_value());
  EXPECT_TRUE(regrown.isnan().all().item<bool>());  // what resize_ returned: the case is exercised
}

TEST(Divergence, TheCauseNamesThePhase) {
  DivergenceFacts batch;
  batch.non_finite_input = "tensor 0 Float[8, 1, 32, 32]";
  EXPECT_TRUE(has(divergence_cause(batch, 4, 0.1), "the batch holds non-finite values (tensor 0"));

  DivergenceFacts weights;
  weights.non_finite_parameter = "parameter fc.weight";
  const std::string loaded = divergence_cause(weights, 0, 0.1);
  EXPECT_TRUE(has(loaded, "before this run's first update") && !has(loaded, "--lr")) << loaded;
  const std::string updated = divergence_cause(weights, 3, 0.1);
  EXPECT_TRUE(has(updated, "one of this run's 3 update(s) made it so; lower --lr (now 0.1)")) << updated;
  weights.parameter_trained = false;  // a LoRA base: no update writes it
  const std::string frozen = divergence_cause(weights, 3, 0.1);
  EXPECT_TRUE(has(frozen, "is not trained") && !has(frozen, "--lr")) << frozen;

  DivergenceFacts statistics;
  statistics.non_finite_buffer = "features.1.running_var";
  const std::string frozen_statistics = divergence_cause(statistics, 3, 0.1);
  EXPECT_TRUE(has(frozen_statistics, "buffer features.1.running_var holds non-finite values that the forward read") &&
              !has(frozen_statistics, "--lr"))
      << frozen_statistics;

  DivergenceFacts sharded;
  sharded.not_rerun = "under --sharding fsdp the forward is not run again";
  EXPECT_TRUE(has(divergence_cause(sharded, 3, 0.1), "its op is not named: under --sharding fsdp"));

  DivergenceFacts flaky;
  flaky.rerun_finite = true;
  flaky.origin = NonFiniteOrigin{};  // an op made inf that the loss did not take up: the rerun's verdict stands
  EXPECT_TRUE(has(divergence_cause(flaky, 3, 0.1), "not reproducible"));

  // Gradients non-finite from a finite loss (the op named: test_loop's NonFiniteGradients case).
  DivergenceFacts elsewhere;
  elsewhere.non_finite_gradient = "gradient of fc.weight";
  elsewhere.rerun_finite = true;  // this rank's last micro-batch gives finite gradients
  const std::string other_rank = divergence_cause(elsewhere, 3, 0.1);
  EXPECT_TRUE(has(other_rank, "the gradient of fc.weight was non-finite after this step's backward, from a finite") &&
              has(other_rank, "another rank's gradients") && !has(other_rank, "--lr"))
      << other_rank;
  DivergenceFacts sharded_gradients;
  sharded_gradients.non_finite_gradient = "gradient of this rank's shard of trained tensor 2";
  sharded_gradients.not_rerun = "under --sharding fsdp the step is not run again";
  EXPECT_TRUE(has(divergence_cause(sharded_gradients, 3, 0.1),
                  "shard of trained tensor 2 was non-finite after this step's backward, from a finite loss and finite "
                  "weights (its op is not named: under --sharding fsdp"));
}

TEST(Divergence, FirstNonFiniteNamesTheFirstTensorInOrder) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(
      first_non_finite({{"a", torch::ones({2})}, {"b", torch::tensor({1.0f, inf})}, {"c", torch::full({1}, inf)}}),
      "b");
  EXPECT_EQ(first_non_finite({{"ids", torch::arange(4)}, {"a", torch::ones({2}, torch::kBFloat16)}}), "");
}

}  // namespace
}  // namespace mgbench::train
