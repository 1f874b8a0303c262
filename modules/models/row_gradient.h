#pragma once
// A weight's gradient handed over a block of rows at a time, as its backward makes it, instead of
// whole through autograd: the backward of a 128k-row token embedding or output head makes a [V, H]
// gradient that, under FSDP, a rank holds whole beside its shards until it is reduce-scattered
// (1 GB for Llama 3 8B's head in bf16, on every rank). With a sink, FSDP reduce-scatters each block
// while the next is made (train/parallel/fsdp.h), and no rank holds the whole gradient. The
// backwards that can: the embedding lookup here and models::target_log_probs (the head).
#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace mgbench::models {

/// Rows [first, first + rows) of a weight.
struct RowRange {
  std::int64_t first = 0;
  std::int64_t rows = 0;
};

/// Takes the gradient of a weight [V, H] a block of rows at a time. The blocks are disjoint and
/// cover every row.
class RowGradientSink {
 public:
  virtual ~RowGradientSink() = default;
  virtual std::int64_t blocks() const = 0;
  /// Block b's rows, in the order its gradient concatenates them.
  virtual std::vector<RowRange> block(std::int64_t b) const = 0;
  /// Block b's gradient: [rows of block(b), H], the weight's dtype, contiguous. Called once per
  /// block, in block order, from the weight's backward; the sink keeps it as long as it needs.
  virtual void take(std::int64_t b, torch::Tensor gradient) = 0;
};

/// The dtype a gradient is summed in before its cast back: fp64 for fp64, else fp32.
inline torch::ScalarType gradient_sum_dtype(torch::ScalarType dtype) {
  return dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

/// sink's blocks, each checked to lie inside a weight of `rows` rows and together to have as many
/// rows as it. Throws std::logic_error otherwise, or for no blocks.
std::vector<std::vector<RowRange>> row_blocks(const RowGradientSink& sink, std::int64_t rows);

/// Embedding lookup: weight [V, H] rows at tokens int64 [...] -> [..., H] (torch::embedding,
/// no padding index). Gradients as autograd's embedding backward: the output gradient's rows
/// summed into the rows of their tokens, in fp32 (fp64 for fp64 weights) and cast to the weight's
/// dtype; handed to `weight_gradient` block by block where it is given (nullptr: whole, through
/// autograd). Throws std::invalid_argument for a weight that is not 2-D or tokens not int64.
torch::Tensor embedding_lookup(const torch::Tensor& tokens, const torch::Tensor& weight,
                               RowGradientSink* weight_gradient);

}  // namespace mgbench::models
