#include "train/optim/grad_scaler.h"

#include <map>
#include <stdexcept>

namespace mgbench::train {

GradScaler::GradScaler(GradScalerOptions options, runtime::Communicator* comm) : options_(options), comm_(comm) {
  if (!(options_.init_scale > 0) || !(options_.growth_factor > 1) || !(options_.backoff_factor > 0) ||
      !(options_.backoff_factor < 1) || options_.growth_interval < 1) {
    throw std::invalid_argument(
        "GradScaler: expected init_scale > 0, growth_factor > 1, backoff_factor in (0, 1), growth_interval >= 1");
  }
}

void GradScaler::lazy_init(const torch::Device& device) {
  if (scale_.defined()) return;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  double scale = options_.init_scale;
  std::int64_t tracker = 0;
  if (pending_state_) std::tie(scale, tracker) = *pending_state_;
  scale_ = torch::full({}, scale, f32);
  growth_tracker_ = torch::full({}, tracker, f32.dtype(torch::kInt32));
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (!options_.enabled) return loss;
  lazy_init(loss.device());
  return loss * scale_.to(loss.device(), /*non_blocking=*/true);
}

torch::Tensor GradScaler::unscale(torch::optim::Optimizer& optimizer) { return find_non_finite(optimizer, true); }

torch::Tensor GradScaler::check(torch::optim::Optimizer& optimizer) { return find_non_finite(optimizer, false); }

torch::Tensor GradScaler::find_non_finite(torch::optim::Optimizer& optimizer, bool divide) {
  if (!options_.enabled) return {};
  if (unscaled_) {
    throw std::logic_error("GradScaler::unscale / check: already called for this step; call update() first");
  }
  // Gradients grouped by (device, dtype): the fused kernel takes one list per group.
  std::map<std::pair<std::string, int>, std::vector<torch::Tensor>> groups;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (p.grad().scalar_type() == torch::kHalf) {
        throw std::invalid_argument(
            "GradScaler::unscale: fp16 gradients (use fp32 master weights: --precision amp-fp16)");
      }
      groups[{p.grad().device().str(), static_cast<int>(p.grad().scalar_type())}].push_back(p.mutable_grad());
    }
  }
  if (groups.empty() && comm_ == nullptr) {
    unscaled_ = true;
    return {};
  }
  // Sharded: a rank without gradients still takes part in the agreement.
  torch::Device device(torch::kCPU);
  if (!groups.empty()) {
    device = torch::Device(groups.begin()->first.first);
  } else if (!optimizer.param_groups().empty() && !optimizer.param_groups().front().params().empty()) {
    device = optimizer.param_groups().front().params().front().device();
  }
  lazy_init(device);
  found_inf_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  // 1/S computed in double then rounded, as PyTorch does; 1 for the check alone (torch's dummy).
  const torch::Tensor inv_scale =
      divide ? scale_.to(torch::kFloat64).reciprocal().to(torch::kFloat32) : torch::ones({}, found_inf_.options());
  for (auto& [key, grads] : groups) {
    const torch::Device d(key.first);
    if (d == device) {
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, inv_scale);
    } else {  // gradients on another device (DP replicas): check there, combine here (a flag: at most 1)
      torch::Tensor found = torch::zeros({}, found_inf_.options().device(d));
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found, inv_scale.to(d));
      found_inf_ = torch::maximum(found_inf_, found.to(device));
    }
  }
  if (comm_ != nullptr) comm_->all_reduce(found_inf_, runtime::ReduceOp::kMax)->wait();
  unscaled_ = true;
  return found_inf_;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  if (!unscaled_) unscale(optimizer);
  if (found_inf_.defined() && found_inf_.item<float>() != 0.0F) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  if (!unscaled_) throw std::logic_error("GradScaler::update: no unscale()/step() since the last update()");
  if (found_inf_.defined()) {
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor, options_.backoff_factor,
                           options_.growth_interval);
  }
  unscaled_ = false;
  found_inf_ = torch::Tensor();
}

double GradScaler::get_scale() const {
  if (!scale_.defined()) return pending_state_ ? pending_state_->first : options_.init_scale;
  return scale_.item<double>();
}

torch::Tensor GradScaler::scale_tensor() const {
  if (!scale_.defined()) return torch::full({}, get_scale(), torch::kFloat32);
  return scale_.clone();
}

std::int64_t GradScaler::growth_tracker() const {
  if (!growth_tracker_.defined()) return pending_state_ ? pending_state_->second : 0;
  return growth_tracker_.item<std::int64_t>();
}

void GradScaler::load_state(double scale, std::int64_t growth_tracker) {
  if (scale_.defined()) {
    scale_.fill_(scale);
    growth_tracker_.fill_(growth_tracker);
  } else {
    pending_state_ = {scale, growth_tracker};
  }
}

}  // namespace mgbench::train
