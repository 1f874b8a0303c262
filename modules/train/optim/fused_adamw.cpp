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
      std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
      std::vector<const void*> keys;  // the parameters' TensorImpls: their device step counts
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
      d.host += 1;  // the counts' add below
      last_stepped_.push_back(key);
      auto it = std::find_if(lists.begin(), lists.end(),
                             [&](const Lists& l) { return l.device == p.device() && l.dtype == p.scalar_type(); });
      if (it == lists.end()) {
        it = lists.insert(lists.end(), Lists{p.device(), p.scalar_type(), {}, {}, {}, {}, {}, {}});
      }
      it->params.push_back(p);
      it->grads.push_back(g);
      it->exp_avgs.push_back(s.exp_avg());
      it->exp_avg_sqs.push_back(s.exp_avg_sq());
      if (o.amsgrad()) it->max_exp_avg_sqs.push_back(s.max_exp_avg_sq());
      it->keys.push_back(key);
    }
    const auto [beta1, beta2] = o.betas();
    for (auto& l : lists) {
      const auto on = [&l](const torch::Tensor& t) -> std::optional<torch::Tensor> {
        if (!t.defined()) return std::nullopt;
        return t.to(l.device, torch::kFloat32, /*non_blocking=*/true);
      };
      const std::optional<torch::Tensor> divisor = on(grad_divisor), skip = on(found_inf);
      const torch::Tensor counts = step_counts(l.keys);
      counts.add_(1.0);
      at::_fused_adamw_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, device_steps(l.keys), o.lr(),
                        beta1, beta2, o.weight_decay(), o.eps(), o.amsgrad(), /*maximize=*/false, divisor, skip);
      // A skipped step's counts given back on the device, as torch's _fused_adamw does.
      if (skip) counts.sub_(*skip);
    }
  }
}

torch::Tensor FusedAdamW::step_counts(const std::vector<const void*>& keys) {
  const std::vector<torch::Tensor> steps = device_steps(keys);
  for (const StepCounts& c : step_counts_) {
    const auto in_counts = [&](const torch::Tensor& t) { return t.is_alias_of(c.counts); };
    if (c.keys == keys && std::all_of(steps.begin(), steps.end(), in_counts)) return c.counts;
  }
  // A new set of parameters stepping together (the first step, parameters without gradients this
  // step, a count made afresh on another device): their counts gathered into one tensor, each parameter's count a view
  // of it.
  StepCounts fresh{keys, torch::stack(steps)};
  for (std::size_t i = 0; i < keys.size(); ++i) device_steps_.at(keys[i]).value = fresh.counts.select(0, i);
  // A parameter's count lives in the newest set that holds it; older sets holding it are dropped.
  std::erase_if(step_counts_, [&](const StepCounts& c) {
    return std::any_of(c.keys.begin(), c.keys.end(),
                       [&](const void* k) { return std::find(keys.begin(), keys.end(), k) != keys.end(); });
  });
  step_counts_.push_back(std::move(fresh));
  return step_counts_.back().counts;
}

std::vector<torch::Tensor> FusedAdamW::device_steps(const std::vector<const void*>& keys) const {
  std::vector<torch::Tensor> steps;
  steps.reserve(keys.size());
  for (const void* key : keys) steps.push_back(device_steps_.at(key).value);
  return steps;
}

}  // namespace mgbench::train
