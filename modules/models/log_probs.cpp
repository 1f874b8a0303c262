#include "models/log_probs.h"

#include <algorithm>
#include <stdexcept>

namespace mgbench::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// The sink's blocks, or one block of every row.
std::vector<std::vector<RowRange>> blocks_of(const RowGradientSink* sink, std::int64_t vocab) {
  if (sink == nullptr) return {{RowRange{0, vocab}}};
  return row_blocks(*sink, vocab);
}

/// log_softmax(h W^T)[t] by chunks of rows; backward recomputes each chunk's logits, or (factor)
/// scales the input gradient's factor computed in forward.
class TargetLogProbs : public torch::autograd::Function<TargetLogProbs> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const torch::Tensor& targets, std::int64_t chunk_elements, bool factor,
                               RowGradientSink* sink) {
    const std::int64_t n = hidden.size(0);
    const std::int64_t rows = std::max<std::int64_t>(1, chunk_elements / std::max<std::int64_t>(1, weight.size(0)));
    torch::Tensor out = torch::empty({n}, hidden.options().dtype(torch::kFloat32));
    torch::Tensor lse = torch::empty({n}, out.options());
    // d log p_t / d h = W[t] - softmax(h W^T) W, per row.
    torch::Tensor d_hidden = factor ? torch::empty_like(hidden) : torch::Tensor();
    for (std::int64_t start = 0; start < n; start += rows) {
      const std::int64_t len = std::min(rows, n - start);
      const torch::Tensor t = targets.narrow(0, start, len);
      torch::Tensor logits = torch::nn::functional::linear(hidden.narrow(0, start, len), weight).to(torch::kFloat32);
      const torch::Tensor chunk_lse = logits.logsumexp(-1);
      lse.narrow(0, start, len).copy_(chunk_lse);
      out.narrow(0, start, len).copy_(logits.gather(1, t.unsqueeze(1)).squeeze(1) - chunk_lse);
      if (factor) {
        const torch::Tensor probs = logits.sub_(chunk_lse.unsqueeze(1)).exp_().to(weight.scalar_type());
        d_hidden.narrow(0, start, len).copy_(weight.index_select(0, t).sub(probs.mm(weight)));
      }
    }
    if (factor) {
      ctx->save_for_backward({d_hidden});
    } else {
      ctx->save_for_backward({hidden, weight, targets, lse});
    }
    ctx->saved_data["chunk_elements"] = chunk_elements;
    ctx->saved_data["factor"] = factor;
    ctx->saved_data["sink"] = reinterpret_cast<std::int64_t>(sink);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    if (ctx->saved_data["factor"].toBool()) {
      const torch::Tensor& d_hidden = saved[0];
      const torch::Tensor g = grads[0].to(torch::kFloat32).unsqueeze(1).to(d_hidden.scalar_type());
      return {d_hidden * g, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    }
    const torch::Tensor& hidden = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& targets = saved[2];
    const torch::Tensor& lse = saved[3];
    const std::int64_t chunk_elements = ctx->saved_data["chunk_elements"].toInt();
    const bool want_hidden = ctx->needs_input_grad(0);
    const bool want_weight = ctx->needs_input_grad(1);
    auto* sink = want_weight ? reinterpret_cast<RowGradientSink*>(ctx->saved_data["sink"].toInt()) : nullptr;
    // Without a sink one block of one range, the whole vocabulary: each chunk's input gradient is
    // one product, written in place. With one, the ranges' products are summed.
    const std::vector<std::vector<RowRange>> blocks = blocks_of(sink, weight.size(0));
    const bool summed = blocks.size() > 1 || blocks.front().size() > 1;
    const std::int64_t n = hidden.size(0);
    torch::Tensor grad_hidden;
    if (want_hidden) {
      grad_hidden = summed ? torch::zeros_like(hidden, hidden.options().dtype(gradient_sum_dtype(hidden.scalar_type())))
                           : torch::empty_like(hidden);
    }
    const torch::Tensor grad_out = grads[0].to(torch::kFloat32);
    torch::Tensor grad_weight;
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      std::int64_t block_rows = 0, longest = 1;
      for (const RowRange& r : blocks[b]) {
        block_rows += r.rows;
        longest = std::max(longest, r.rows);
      }
      // [rows of the block, H]: each range's rows of the first chunk's product, the later chunks
      // accumulated into them in place (no second product beside the sum).
      torch::Tensor grad_block;
      if (want_weight) {
        grad_block = n > 0 ? torch::empty({block_rows, weight.size(1)}, weight.options())
                           : torch::zeros({block_rows, weight.size(1)}, weight.options());  // no rows
      }
      const std::int64_t rows = std::max<std::int64_t>(1, chunk_elements / longest);
      for (std::int64_t start = 0; start < n; start += rows) {
        const std::int64_t len = std::min(rows, n - start);
        const torch::Tensor h = hidden.narrow(0, start, len);
        const torch::Tensor g = grad_out.narrow(0, start, len).unsqueeze(1);
        const torch::Tensor chunk_lse = lse.narrow(0, start, len).unsqueeze(1);
        const torch::Tensor t = targets.narrow(0, start, len).unsqueeze(1);
        std::int64_t offset = 0;
        for (const RowRange& r : blocks[b]) {
          const torch::Tensor w = weight.narrow(0, r.first, r.rows);
          // d log p / d logits = onehot(t) - softmax: times the incoming gradient of each row. In
          // place on the recomputed logits: one [rows, range] fp32 buffer, freed before the products.
          torch::Tensor grad_logits = torch::nn::functional::linear(h, w).to(torch::kFloat32);
          grad_logits.sub_(chunk_lse).exp_().mul_(-g);
          if (r.rows == weight.size(0)) {
            grad_logits.scatter_add_(1, t, g);
          } else {  // the targets in this range (no host sync: the others add zero)
            const torch::Tensor in_range = t.ge(r.first).logical_and(t.lt(r.first + r.rows));
            grad_logits.scatter_add_(1, (t - r.first).clamp(0, r.rows - 1), g * in_range);
          }
          const torch::Tensor grad_linear = grad_logits.to(weight.scalar_type());  // as autograd casts back
          grad_logits = torch::Tensor();
          if (want_hidden) {
            torch::Tensor rows_grad = grad_hidden.narrow(0, start, len);
            if (summed) {
              rows_grad.add_(grad_linear.mm(w));
            } else {
              rows_grad.copy_(grad_linear.mm(w));
            }
          }
          if (want_weight) {
            torch::Tensor dst = grad_block.narrow(0, offset, r.rows);
            if (start == 0) {
              at::mm_out(dst, grad_linear.t(), h);
            } else {
              dst.addmm_(grad_linear.t(), h);
            }
          }
          offset += r.rows;
        }
      }
      if (sink != nullptr) {
        sink->take(static_cast<std::int64_t>(b), std::move(grad_block));
      } else {
        grad_weight = std::move(grad_block);
      }
    }
    if (summed && want_hidden) grad_hidden = grad_hidden.to(hidden.scalar_type());
    return {grad_hidden, grad_weight, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor target_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                               std::int64_t chunk_elements, FrozenHeadGradient frozen,
                               RowGradientSink* weight_gradient) {
  if (hidden.dim() != 2 || weight.dim() != 2 || targets.dim() != 1 || hidden.size(1) != weight.size(1) ||
      hidden.size(0) != targets.size(0)) {
    throw std::invalid_argument("target_log_probs: expected hidden [N, H], weight [V, H], targets [N]");
  }
  // The factor serves a frozen weight whose input wants a gradient (grad mode on: not a
  // reference model's or an evaluation's forward).
  const bool factor = frozen != FrozenHeadGradient::kRecompute && !weight.requires_grad() && hidden.requires_grad() &&
                      torch::GradMode::is_enabled();
  return TargetLogProbs::apply(hidden, weight, targets, std::max<std::int64_t>(1, chunk_elements), factor,
                               factor ? nullptr : weight_gradient);
}

}  // namespace mgbench::models
