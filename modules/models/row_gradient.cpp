#include "models/row_gradient.h"

#include <stdexcept>

namespace mgbench::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// torch::embedding forward; backward sums the output gradient's rows into each block's rows and
/// hands the blocks to the sink.
class EmbeddingByRows : public torch::autograd::Function<EmbeddingByRows> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& tokens, const torch::Tensor& weight,
                               RowGradientSink* sink) {
    ctx->save_for_backward({tokens});
    ctx->saved_data["rows"] = weight.size(0);
    ctx->saved_data["sink"] = reinterpret_cast<std::int64_t>(sink);
    return torch::embedding(weight, tokens);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const torch::Tensor ids = ctx->get_saved_variables()[0].reshape({-1});  // [N]
    auto* sink = reinterpret_cast<RowGradientSink*>(ctx->saved_data["sink"].toInt());
    const torch::Tensor& out = grads[0];
    const torch::Tensor g = out.reshape({ids.size(0), -1}).to(gradient_sum_dtype(out.scalar_type()));  // [N, H]
    const std::vector<std::vector<RowRange>> blocks = row_blocks(*sink, ctx->saved_data["rows"].toInt());
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      std::int64_t block_rows = 0;
      for (const RowRange& r : blocks[b]) block_rows += r.rows;
      // Each token's row in the block, or the spare row past its end for a token outside it, then
      // the kernel autograd's embedding gradient uses (at::embedding_dense_backward) over the block
      // and that row: no host sync, and a GPU sums as autograd's does (index_add_ there adds
      // atomically, in no fixed order).
      torch::Tensor slot = torch::full_like(ids, block_rows);
      std::int64_t offset = 0;
      for (const RowRange& r : blocks[b]) {
        slot = torch::where(ids.ge(r.first).logical_and(ids.lt(r.first + r.rows)), ids + (offset - r.first), slot);
        offset += r.rows;
      }
      const torch::Tensor sums = at::embedding_dense_backward(g, slot, block_rows + 1, /*padding_idx=*/-1,
                                                              /*scale_grad_by_freq=*/false);
      sink->take(static_cast<std::int64_t>(b), sums.narrow(0, 0, block_rows).to(out.scalar_type()).contiguous());
    }
    return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

std::vector<std::vector<RowRange>> row_blocks(const RowGradientSink& sink, std::int64_t rows) {
  std::vector<std::vector<RowRange>> blocks;
  std::int64_t covered = 0;
  for (std::int64_t b = 0; b < sink.blocks(); ++b) {
    blocks.push_back(sink.block(b));
    for (const RowRange& r : blocks.back()) {
      if (r.first < 0 || r.rows < 1 || r.first + r.rows > rows) {
        throw std::logic_error("row gradient: a block's rows lie outside the weight");
      }
      covered += r.rows;
    }
  }
  if (blocks.empty() || covered != rows)
    throw std::logic_error("row gradient: the blocks do not cover the weight's rows");
  return blocks;
}

torch::Tensor embedding_lookup(const torch::Tensor& tokens, const torch::Tensor& weight,
                               RowGradientSink* weight_gradient) {
  if (weight.dim() != 2 || tokens.scalar_type() != torch::kInt64) {
    throw std::invalid_argument("embedding_lookup: expected weight [V, H] and int64 tokens");
  }
  if (weight_gradient == nullptr || !weight.requires_grad() || !torch::GradMode::is_enabled()) {
    return torch::embedding(weight, tokens);
  }
  return EmbeddingByRows::apply(tokens, weight, weight_gradient);
}

}  // namespace mgbench::models
