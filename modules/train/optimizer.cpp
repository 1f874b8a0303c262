#include "train/optimizer.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>

namespace mgbench::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainOptions& o, std::vector<torch::Tensor> params) {
  switch (o.optimizer) {
    case OptimizerKind::kSgd:
      return std::make_unique<torch::optim::SGD>(
          std::move(params),
          torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay).nesterov(o.momentum > 0));
    case OptimizerKind::kAdamW:
      return std::make_unique<FusedAdamW>(std::move(params),
                                          torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
  }
  throw std::logic_error("optimizer missing from make_optimizer");
}

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

std::int64_t optimizer_states_per_element(const TrainOptions& o) {
  if (o.optimizer == OptimizerKind::kAdamW) return 2;
  return o.momentum > 0 ? 1 : 0;
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                             runtime::Communicator* sharded_over) {
  if (!(max_norm > 0)) throw std::invalid_argument("clip_grad_norm: max_norm must be > 0");
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  torch::NoGradGuard no_grad;
  torch::Tensor total;
  if (!grads.empty()) {
    const torch::Device device = grads.front().device();
    std::vector<torch::Tensor> norms;
    for (const auto& n : at::_foreach_norm(grads, 2)) norms.push_back(n.to(device, /*non_blocking=*/true));
    total = torch::linalg_vector_norm(torch::stack(norms), 2, std::nullopt, false, std::nullopt);
  }
  if (sharded_over != nullptr) {
    const torch::Device device = params.empty() ? torch::Device(torch::kCPU) : params.front().device();
    const bool fp64 = total.defined() && total.scalar_type() == torch::kFloat64;
    torch::Tensor squares = total.defined() ? total.to(fp64 ? torch::kFloat64 : torch::kFloat32).square()
                                            : torch::zeros({}, torch::TensorOptions(torch::kFloat32).device(device));
    squares = squares.reshape({1}).contiguous();
    sharded_over->all_reduce(squares, runtime::ReduceOp::kSum)->wait();
    total = squares.sqrt().reshape({});
    if (!grads.empty()) total = total.to(grads.front().scalar_type());
  }
  if (grads.empty()) return total.defined() ? total : torch::zeros({});
  const torch::Tensor coef = torch::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (auto& g : grads) g.mul_(coef.to(g.device(), /*non_blocking=*/true));
  return total;
}

}  // namespace mgbench::train
