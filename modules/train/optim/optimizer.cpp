#include "train/optim/optimizer.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>

namespace mgbench::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& o, std::vector<torch::Tensor> params) {
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

std::int64_t optimizer_states_per_element(const OptimizerOptions& o) {
  if (o.optimizer == OptimizerKind::kAdamW) return 2;
  return o.momentum > 0 ? 1 : 0;
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

void set_gradients_to_none(torch::optim::Optimizer& optimizer) {
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) p.mutable_grad() = torch::Tensor();
  }
}

void zero_gradients(torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> grads;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
  }
  if (!grads.empty()) at::_foreach_zero_(grads);
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
    // The collective's dtype and device from the parameters, which every rank holds alike (a shard
    // of each), never from the gradients: a rank without one would send another dtype than its peers.
    if (params.empty()) throw std::invalid_argument("clip_grad_norm: a sharded norm needs this rank's parameters");
    const bool fp64 = std::any_of(params.begin(), params.end(),
                                  [](const torch::Tensor& p) { return p.scalar_type() == torch::kFloat64; });
    const auto options = torch::TensorOptions(fp64 ? torch::kFloat64 : torch::kFloat32).device(params.front().device());
    torch::Tensor squares = total.defined() ? total.to(options).square() : torch::zeros({}, options);
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
