#include "train/update.h"

#include <algorithm>
#include <vector>

#include "train/optim/optimizer.h"

namespace mgbench::train {
namespace {

/// The flag a fused step skips on: the scaler's non-finite gradients or a step without a target
/// (either may be undefined), float32 [] 1 or 0, on the device.
torch::Tensor skip_flag(const torch::Tensor& found_inf, const torch::Tensor& empty) {
  if (!found_inf.defined()) return empty;
  if (!empty.defined()) return found_inf;
  return torch::maximum(found_inf.reshape({}), empty);
}

/// The optimizer's fused step with the normalisation, the loss scale's division and the skip
/// inside its kernel; the skip flag (undefined without loss scaling or a device factor).
torch::Tensor fused_step(const RunSetup& setup, TrainingState& training, FusedAdamW& fused,
                         const GradientScale& scale) {
  torch::Tensor divisor, found_inf;
  if (training.scaler) {
    found_inf = training.scaler->check(*training.optimizer);
    divisor = scale.factor.defined() ? training.scaler->scale_tensor() / scale.factor.to(torch::kFloat32)
                                     : training.scaler->scale_tensor() / scale.value;
  } else if (scale.factor.defined()) {
    divisor = scale.factor.reciprocal().to(torch::kFloat32);
  } else if (scale.value != 1.0) {
    divisor = torch::full({}, 1.0 / scale.value, torch::TensorOptions(torch::kFloat32).device(setup.device));
  }
  const torch::Tensor skip = skip_flag(found_inf, scale.empty);
  fused.step_scaled(divisor, skip);
  if (training.scaler) training.scaler->update();  // on the scaler's own flag: no target is no overflow
  return skip;
}

/// Every gradient times the scale (optimizer_update's second case).
void scale_gradients(const RunSetup& setup, TrainingState& training, const GradientScale& scale) {
  if (!scale.factor.defined() && scale.value == 1.0) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> low;  // gradients below float64, scaled in one unscale kernel
  for (auto& t : training.trainable) {
    if (!t.grad().defined()) continue;
    if (!scale.factor.defined()) {
      t.mutable_grad().mul_(scale.value);
    } else if (t.grad().scalar_type() == torch::kFloat64) {
      t.mutable_grad().mul_(scale.factor);
    } else {
      low.push_back(t.grad());
    }
  }
  if (low.empty()) return;
  // The kernel's non-finite flag is not used: gradients_finite (step.cpp) or the scaler checks.
  torch::Tensor unused = torch::zeros({1}, torch::TensorOptions(torch::kFloat32).device(setup.device));
  at::_amp_foreach_non_finite_check_and_unscale_(low, unused, scale.factor.to(torch::kFloat32));
}

/// Whether the host must skip the step for want of targets (a sync where the flag is on a device).
bool no_target(const GradientScale& scale) { return scale.empty.defined() && scale.empty.item<float>() != 0.0F; }

}  // namespace

std::optional<GradientScale> gradient_scale(const RunSetup& setup, double normalizer, std::int64_t micro_batches) {
  if (setup.recipe.loss_normalization() == LossNormalization::kMeanPerMicroBatch) {
    return GradientScale::on_host(1.0 / static_cast<double>(micro_batches));
  }
  if (setup.world_size() == 1) {  // its own count: no collective, nothing to read
    if (normalizer <= 0) return std::nullopt;
    return GradientScale::on_host(1.0 / normalizer);
  }
  const auto options = torch::TensorOptions(torch::kFloat64).device(setup.device);
  torch::Tensor targets = torch::full({}, normalizer, options);
  setup.comm.all_reduce(targets, runtime::ReduceOp::kSum)->wait();
  GradientScale scale;
  // world / targets as the host divides (the counts are whole numbers); 1 for no target, whose
  // zero gradients stay finite while the flag skips the update.
  scale.factor = torch::full({}, static_cast<double>(setup.world_size()), options).div_(targets.clamp_min(1));
  scale.empty = targets.le(0).to(torch::kFloat32);
  return scale;
}

torch::Tensor optimizer_update(const RunSetup& setup, TrainingState& training, const GradientScale& scale) {
  auto* fused = dynamic_cast<FusedAdamW*>(training.optimizer.get());
  const double max_norm = setup.options.optim.clip_grad_norm;
  const bool fp64 = std::any_of(training.trainable.begin(), training.trainable.end(),
                                [](const torch::Tensor& t) { return t.scalar_type() == torch::kFloat64; });
  if (fused != nullptr && max_norm <= 0 && !fp64) return fused_step(setup, training, *fused, scale);
  // torch's other optimizers cannot skip on a device flag: a step without targets is read here (a
  // host sync, as GradScaler's step reads its flag) and not taken, the scaler left as one rank leaves it.
  if (fused == nullptr && no_target(scale)) return scale.empty;
  scale_gradients(setup, training, scale);
  const auto clip = [&] {
    if (max_norm > 0) clip_grad_norm(training.trainable, max_norm, training.fsdp() ? &setup.comm : nullptr);
  };
  if (training.scaler) {
    const torch::Tensor found_inf = training.scaler->unscale(*training.optimizer);  // the true gradients, for clipping
    clip();
    if (fused != nullptr) {  // the fused kernel skips on the flag: no sync
      const torch::Tensor skip = skip_flag(found_inf, scale.empty);
      fused->step_scaled({}, skip);
      training.scaler->update();
      return skip;
    }
    const bool stepped = training.scaler->step(*training.optimizer);  // unscaled already: its sync and the step
    training.scaler->update();
    return torch::full({}, stepped ? 0.0 : 1.0);
  }
  clip();
  if (fused != nullptr) {
    fused->step_scaled({}, scale.empty);
    return scale.empty;
  }
  training.optimizer->step();
  return {};
}

}  // namespace mgbench::train
