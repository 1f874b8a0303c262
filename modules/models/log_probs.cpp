#include "models/log_probs.h"

#include <algorithm>
#include <stdexcept>

namespace mgbench::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// log_softmax(h W^T)[t] by chunks of rows; backward recomputes each chunk's logits, or (factor)
/// scales the input gradient's factor computed in forward.
class TargetLogProbs : public torch::autograd::Function<TargetLogProbs> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const torch::Tensor& targets, std::int64_t rows, bool factor) {
    const std::int64_t n = hidden.size(0);
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
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["factor"] = factor;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    if (ctx->saved_data["factor"].toBool()) {
      const torch::Tensor& d_hidden = saved[0];
      const torch::Tensor g = grads[0].to(torch::kFloat32).unsqueeze(1).to(d_hidden.scalar_type());
      return {d_hidden * g, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    }
    const torch::Tensor& hidden = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& targets = saved[2];
    const torch::Tensor& lse = saved[3];
    const std::int64_t rows = ctx->saved_data["rows"].toInt();
    const torch::Tensor grad_out = grads[0].to(torch::kFloat32);
    const bool want_hidden = ctx->needs_input_grad(0);
    const bool want_weight = ctx->needs_input_grad(1);
    torch::Tensor grad_hidden = want_hidden ? torch::empty_like(hidden) : torch::Tensor();
    torch::Tensor grad_weight;  // [V, H]: the first chunk's product, the later ones accumulated into it in place
    const std::int64_t n = hidden.size(0);
    for (std::int64_t start = 0; start < n; start += rows) {
      const std::int64_t len = std::min(rows, n - start);
      const torch::Tensor h = hidden.narrow(0, start, len);
      // d log p / d logits = onehot(t) - softmax: times the incoming gradient of each row. In place
      // on the recomputed logits: one [rows, V] fp32 buffer, freed before the [V, H] product.
      torch::Tensor grad_logits = torch::nn::functional::linear(h, weight).to(torch::kFloat32);
      const torch::Tensor g = grad_out.narrow(0, start, len).unsqueeze(1);
      grad_logits.sub_(lse.narrow(0, start, len).unsqueeze(1)).exp_().mul_(-g);
      grad_logits.scatter_add_(1, targets.narrow(0, start, len).unsqueeze(1), g);
      const torch::Tensor grad_linear = grad_logits.to(weight.scalar_type());  // as autograd casts back
      grad_logits = torch::Tensor();
      if (want_hidden) grad_hidden.narrow(0, start, len).copy_(grad_linear.mm(weight));
      if (!want_weight) continue;
      if (grad_weight.defined()) {
        grad_weight.addmm_(grad_linear.t(), h);  // no second [V, H] product beside the sum
      } else {
        grad_weight = grad_linear.t().mm(h);
      }
    }
    if (want_weight && !grad_weight.defined()) grad_weight = torch::zeros_like(weight);  // no rows
    return {grad_hidden, grad_weight, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor target_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                               std::int64_t chunk_elements, FrozenHeadGradient frozen) {
  if (hidden.dim() != 2 || weight.dim() != 2 || targets.dim() != 1 || hidden.size(1) != weight.size(1) ||
      hidden.size(0) != targets.size(0)) {
    throw std::invalid_argument("target_log_probs: expected hidden [N, H], weight [V, H], targets [N]");
  }
  const std::int64_t rows = std::max<std::int64_t>(1, chunk_elements / std::max<std::int64_t>(1, weight.size(0)));
  // The factor serves a frozen weight whose input wants a gradient (grad mode on: not a
  // reference model's or an evaluation's forward).
  const bool factor = frozen != FrozenHeadGradient::kRecompute && !weight.requires_grad() && hidden.requires_grad() &&
                      torch::GradMode::is_enabled();
  return TargetLogProbs::apply(hidden, weight, targets, rows, factor);
}

}  // namespace mgbench::models
