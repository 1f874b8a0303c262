// models::target_log_probs (chunked, recomputed in backward) against the expression it replaces,
// log_softmax(linear(h, W).float()).gather(targets), with autograd's gradients; and the weight's
// gradient handed over by rows (models/row_gradient.h), for the head and the embedding lookup,
// against autograd's whole gradient.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "models/log_probs.h"
#include "models/row_gradient.h"

namespace mgbench {
namespace {

struct Case {
  torch::Tensor value, grad_hidden, grad_weight;
};

Case run(bool fused, torch::ScalarType dtype, std::int64_t chunk_elements, bool weight_grad = true,
         models::FrozenHeadGradient frozen = models::FrozenHeadGradient::kAuto) {
  torch::manual_seed(11);
  torch::Tensor hidden = torch::randn({10, 5}, torch::kFloat64).to(dtype).requires_grad_(true);
  torch::Tensor weight = torch::randn({7, 5}, torch::kFloat64).to(dtype).requires_grad_(weight_grad);
  const torch::Tensor targets = torch::randint(0, 7, {10}, torch::kInt64);
  const torch::Tensor upstream = torch::randn({10}, torch::kFloat32);
  const torch::Tensor value = fused ? models::target_log_probs(hidden, weight, targets, chunk_elements, frozen)
                                    : torch::nn::functional::linear(hidden, weight)
                                          .to(torch::kFloat32)
                                          .log_softmax(-1)
                                          .gather(1, targets.unsqueeze(1))
                                          .squeeze(1);
  (value * upstream).sum().backward();
  return {value.detach(), hidden.grad(), weight_grad ? weight.grad() : torch::Tensor()};
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

TEST(TargetLogProbs, EqualsLogSoftmaxOfTheFullLogitsWithItsGradients) {
  // 3 rows per chunk (21 elements / vocabulary 7): chunk boundaries inside the 10 rows. The softmax is
  // fp32 whatever the inputs' dtype (log_softmax vs logits - logsumexp: a few fp32 ulps apart).
  for (const auto& [dtype, tolerance] : {std::pair{torch::kFloat64, 2e-6}, std::pair{torch::kFloat32, 2e-6}}) {
    const Case fused = run(true, dtype, 21);
    const Case plain = run(false, dtype, 21);
    EXPECT_EQ(fused.value.scalar_type(), torch::kFloat32);
    EXPECT_LT(max_diff(fused.value, plain.value), tolerance);
    EXPECT_LT(max_diff(fused.grad_hidden, plain.grad_hidden), tolerance);
    EXPECT_LT(max_diff(fused.grad_weight, plain.grad_weight), tolerance);
    EXPECT_EQ(fused.grad_hidden.scalar_type(), dtype);
    // One chunk for all rows gives the same.
    EXPECT_LT(max_diff(run(true, dtype, 1 << 20).value, fused.value), tolerance);
  }
  // bf16 logits, as a bf16 model's head computes them; the softmax in fp32.
  const Case fused = run(true, torch::kBFloat16, 21);
  const Case plain = run(false, torch::kBFloat16, 21);
  EXPECT_LT(max_diff(fused.value, plain.value), 1e-5);
  EXPECT_LT(max_diff(fused.grad_hidden, plain.grad_hidden), 2e-2);
  EXPECT_LT(max_diff(fused.grad_weight, plain.grad_weight), 2e-2);
}

TEST(TargetLogProbs, AFrozenHeadGetsNoGradientAndShapesAreChecked) {
  // The input's gradient from the factor computed in forward (the default for a frozen head) and
  // from logits recomputed in backward, both against autograd's (the softmax is fp32 whatever the
  // inputs' dtype: a few fp32 ulps apart).
  for (const auto& [dtype, tolerance] : {std::pair{torch::kFloat64, 2e-6}, std::pair{torch::kFloat32, 2e-6}}) {
    const Case plain = run(false, dtype, 21, /*weight_grad=*/false);
    for (const auto how : {models::FrozenHeadGradient::kAuto, models::FrozenHeadGradient::kRecompute}) {
      const Case fused = run(true, dtype, 21, /*weight_grad=*/false, how);
      EXPECT_LT(max_diff(fused.value, plain.value), 2e-6);
      EXPECT_LT(max_diff(fused.grad_hidden, plain.grad_hidden), tolerance) << static_cast<int>(how);
      EXPECT_EQ(fused.grad_hidden.scalar_type(), dtype);
      EXPECT_FALSE(fused.grad_weight.defined());
    }
  }
  // bf16: the factor's softmax product in bf16, as the recomputed path's logits gradient.
  const Case plain = run(false, torch::kBFloat16, 21, /*weight_grad=*/false);
  const Case factor = run(true, torch::kBFloat16, 21, /*weight_grad=*/false);
  EXPECT_LT(max_diff(factor.grad_hidden, plain.grad_hidden), 2e-2);
  const Case fused = factor;
  EXPECT_THROW(models::target_log_probs(torch::zeros({4, 5}), torch::zeros({7, 6}), torch::zeros({4}, torch::kInt64)),
               std::invalid_argument);
}

/// The largest magnitude of t, at least 1.
double scale_of(const torch::Tensor& t) { return std::max(1.0, t.to(torch::kFloat64).abs().max().item<double>()); }

/// Blocks of row ranges as FSDP makes them (the same rows of every rank's shard), over `ranks` shards
/// of `shard_rows` rows in blocks of `rows`; records what it is handed.
class RecordingSink final : public models::RowGradientSink {
 public:
  RecordingSink(std::int64_t ranks, std::int64_t shard_rows, std::int64_t rows)
      : ranks_(ranks), shard_rows_(shard_rows), rows_(rows) {}
  std::int64_t blocks() const override { return (shard_rows_ + rows_ - 1) / rows_; }
  std::vector<models::RowRange> block(std::int64_t b) const override {
    std::vector<models::RowRange> out;
    for (std::int64_t r = 0; r < ranks_; ++r) {
      out.push_back({r * shard_rows_ + b * rows_, std::min(rows_, shard_rows_ - b * rows_)});
    }
    return out;
  }
  void take(std::int64_t b, torch::Tensor gradient) override {
    EXPECT_EQ(b, static_cast<std::int64_t>(taken.size())) << "blocks out of order";
    EXPECT_TRUE(gradient.is_contiguous());
    taken.push_back(gradient);
  }
  /// The blocks' rows put back where they belong: [V, H].
  torch::Tensor whole(std::int64_t vocab) const {
    torch::Tensor out = torch::full({vocab, taken.front().size(1)}, std::nan(""), taken.front().options());
    for (std::size_t b = 0; b < taken.size(); ++b) {
      std::int64_t offset = 0;
      for (const models::RowRange& r : block(static_cast<std::int64_t>(b))) {
        out.narrow(0, r.first, r.rows).copy_(taken[b].narrow(0, offset, r.rows));
        offset += r.rows;
      }
      EXPECT_EQ(offset, taken[b].size(0));
    }
    return out;
  }
  std::vector<torch::Tensor> taken;

 private:
  std::int64_t ranks_, shard_rows_, rows_;
};

TEST(RowGradient, TheHeadsBlocksAreTheRowsOfAutogradsWholeGradient) {
  // 3 shards of 8 rows (vocabulary 24) in blocks of 3 rows (the last of 2): each block three ranges
  // apart; targets in every block, repeated ones too. Chunks of 30 logits: 1 row forward (vocabulary
  // 24), 10 rows backward (ranges of 3 rows). Forward and the input's gradient as without a sink.
  for (const auto& [dtype, tolerance] : {std::pair{torch::kFloat64, 1e-12}, std::pair{torch::kBFloat16, 2e-2}}) {
    torch::manual_seed(5);
    const torch::Tensor h0 = torch::randn({40, 6}, torch::kFloat64).to(dtype);
    const torch::Tensor w0 = torch::randn({24, 6}, torch::kFloat64).to(dtype);
    const torch::Tensor targets = torch::randint(0, 24, {40}, torch::kInt64);
    const torch::Tensor upstream = torch::randn({40}, torch::kFloat32);
    const auto run = [&](models::RowGradientSink* sink) {
      torch::Tensor h = h0.clone().requires_grad_(true);
      torch::Tensor w = w0.clone().requires_grad_(true);
      const torch::Tensor value = models::target_log_probs(h, w, targets, 30, models::FrozenHeadGradient::kAuto, sink);
      (value * upstream).sum().backward();
      return std::tuple{value.detach(), h.grad(), w.grad()};
    };
    const auto [value, grad_hidden, grad_weight] = run(nullptr);
    RecordingSink sink(3, 8, 3);
    const auto [by_rows_value, by_rows_hidden, by_rows_weight] = run(&sink);
    EXPECT_FALSE(by_rows_weight.defined()) << "handed over, not left to autograd";
    ASSERT_EQ(sink.taken.size(), 3U);
    EXPECT_EQ(sink.taken[2].size(0), 3 * 2);
    EXPECT_EQ(sink.taken[0].scalar_type(), dtype);
    EXPECT_EQ(max_diff(by_rows_value, value), 0.0);
    // bf16: one or two ulps of the largest element (the paths round their sums in other places).
    EXPECT_LT(max_diff(sink.whole(24), grad_weight), tolerance * scale_of(grad_weight));
    EXPECT_LT(max_diff(by_rows_hidden, grad_hidden), tolerance * scale_of(grad_hidden));
    EXPECT_EQ(by_rows_hidden.scalar_type(), dtype);
  }
}

TEST(RowGradient, AHeadWithoutRowsStillHandsOverZeroBlocks) {
  // A rank whose micro-batch has no target makes the same blocks (zeros): every rank issues the
  // same collectives.
  RecordingSink sink(2, 4, 3);
  torch::Tensor h = torch::randn({0, 5}).requires_grad_(true);
  torch::Tensor w = torch::randn({8, 5}).requires_grad_(true);
  models::target_log_probs(h, w, torch::empty({0}, torch::kInt64), 30, models::FrozenHeadGradient::kAuto, &sink)
      .sum()
      .backward();
  ASSERT_EQ(sink.taken.size(), 2U);
  EXPECT_EQ(sink.whole(8).abs().max().item<double>(), 0.0);
}

TEST(RowGradient, TheEmbeddingsBlocksAreTheRowsOfAutogradsWholeGradient) {
  // Tokens [3, 7] over a 20-row embedding in 2 shards of 10 rows, blocks of 4: repeated tokens sum,
  // rows no token reads are zero. The lookup equals torch::embedding's.
  for (const auto& [dtype, tolerance] : {std::pair{torch::kFloat64, 1e-12}, std::pair{torch::kBFloat16, 2e-2}}) {
    torch::manual_seed(3);
    const torch::Tensor w0 = torch::randn({20, 5}, torch::kFloat64).to(dtype);
    torch::Tensor tokens = torch::randint(0, 12, {3, 7}, torch::kInt64);
    tokens[0][0] = 19;
    tokens[1][1] = 19;
    const torch::Tensor upstream = torch::randn({3, 7, 5}, torch::kFloat64).to(dtype);
    torch::Tensor w = w0.clone().requires_grad_(true);
    const torch::Tensor plain = torch::embedding(w, tokens);
    (plain * upstream).sum().backward();
    RecordingSink sink(2, 10, 4);
    torch::Tensor w_rows = w0.clone().requires_grad_(true);
    const torch::Tensor by_rows = models::embedding_lookup(tokens, w_rows, &sink);
    (by_rows * upstream).sum().backward();
    EXPECT_EQ(max_diff(by_rows, plain), 0.0);
    EXPECT_FALSE(w_rows.grad().defined());
    ASSERT_EQ(sink.taken.size(), 3U);
    EXPECT_EQ(sink.taken[0].scalar_type(), dtype);
    EXPECT_LT(max_diff(sink.whole(20), w.grad()), tolerance * scale_of(w.grad()));
    EXPECT_GT(sink.whole(20)[19].abs().max().item<double>(), 0.0);
    EXPECT_EQ(sink.whole(20).narrow(0, 12, 7).abs().max().item<double>(), 0.0);
  }
  // Without a sink, or without a gradient to make, it is torch::embedding.
  const torch::Tensor w = torch::randn({6, 2});
  EXPECT_TRUE(
      models::embedding_lookup(torch::tensor({1, 5}), w, nullptr).equal(w.index_select(0, torch::tensor({1, 5}))));
  EXPECT_THROW(models::embedding_lookup(torch::tensor({1.0}), w, nullptr), std::invalid_argument);
}

TEST(RowGradient, BlocksThatDoNotCoverTheWeightAreRefused) {
  RecordingSink short_of_rows(2, 4, 3);  // 8 rows of a 9-row weight
  EXPECT_THROW(models::row_blocks(short_of_rows, 9), std::logic_error);
  RecordingSink past_the_end(3, 4, 2);  // 12 rows of an 8-row weight
  EXPECT_THROW(models::row_blocks(past_the_end, 8), std::logic_error);
  EXPECT_EQ(models::row_blocks(short_of_rows, 8).size(), 2U);
}

}  // namespace
}  // namespace mgbench
