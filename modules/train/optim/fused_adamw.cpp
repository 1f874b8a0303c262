#include "train/optim/fused_adamw.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>

namespace mgbench::train {

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure) {
    const torch::AutoGradMode enable_grad(true);
    loss = closure();
  }
  step_scaled({}, {});
  return loss;
}

void FusedAdamW::undo_step() {
  if (!undoable_) throw std::logic_error("FusedAdamW::undo_step: no step to undo");
  undoable_ = false;
  for (void* key : last_stepped_) {
    auto& s = static_cast<torch::optim::AdamWParamState&>(*state().at(key));
    s.step(s.step() - 1);
    device_steps_.at(key).host -= 1;  // the device's count was given back with found_inf
  }
  last_stepped_.clear();
}

void FusedAdamW::step_scaled(const torch::Tensor& grad_divisor, const torch::Tensor& found_inf) {
  const torch::NoGradGuard no_grad;
  last_stepped_.clear();
  undoable_ = true;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    // One list each per (device, dtype): the fused kernel's unit, as torch groups them.
    struct Lists {
      torch::Device device;
      torch::ScalarType dtype;
      std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
    };
    std::vector<Lists> lists;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const torch::Tensor& g = p.grad();
      TORCH_CHECK(!g.is_sparse(), "FusedAdamW: sparse gradients are not supported");
      TORCH_CHECK(g.scalar_type() == p.scalar_type() && g.device() == p.device() && g.sizes() == p.sizes(),
                  "FusedAdamW: a gradient ", g.scalar_type(), " ", g.device(), " ", g.sizes(),
                  " differs from its parameter ", p.scalar_type(), " ", p.device(), " ", p.sizes());
      void* key = p.unsafeGetTensorImpl();
      auto& slot = state()[key];
      if (!slot) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        if (o.amsgrad()) fresh->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
      // The device's count follows the state's (a loaded checkpoint sets the state's).
      DeviceStep& d = device_steps_[key];
      if (!d.value.defined() || d.value.device() != p.device()) {
        d.value = torch::zeros({}, torch::TensorOptions(torch::kFloat32).device(p.device()));
        d.host = 0;
      }
      if (d.host != s.step()) {
        d.value.fill_(static_cast<double>(s.step()));
        d.host = s.step();
      }
      s.step(s.step() + 1);
      d.host += 1;  // the _foreach_add_ below
      last_stepped_.push_back(key);
      auto it = std::find_if(lists.begin(), lists.end(),
                             [&](const Lists& l) { return l.device == p.device() && l.dtype == p.scalar_type(); });
      if (it == lists.end()) it = lists.insert(lists.end(), Lists{p.device(), p.scalar_type(), {}, {}, {}, {}, {}, {}});
      it->params.push_back(p);
      it->grads.push_back(g);
      it->exp_avgs.push_back(s.exp_avg());
      it->exp_avg_sqs.push_back(s.exp_avg_sq());
      if (o.amsgrad()) it->max_exp_avg_sqs.push_back(s.max_exp_avg_sq());
      it->steps.push_back(d.value);
    }
    const auto [beta1, beta2] = o.betas();
    for (auto& l : lists) {
      const auto on = [&l](const torch::Tensor& t) -> std::optional<torch::Tensor> {
        if (!t.defined()) return std::nullopt;
        return t.to(l.device, torch::kFloat32, /*non_blocking=*/true);
      };
      const std::optional<torch::Tensor> divisor = on(grad_divisor), skip = on(found_inf);
      at::_foreach_add_(l.steps, 1.0);
      at::_fused_adamw_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, l.steps, o.lr(), beta1, beta2,
                        o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false, divisor, skip);
      // A skipped step's counts given back on the device, as torch's _fused_adamw does.
      if (skip) at::_foreach_sub_(l.steps, std::vector<torch::Tensor>(l.steps.size(), *skip));
    }
  }
}

}  // namespace mgbench::train
