#include "train/step.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <tuple>

#include "runtime/grad_sync.h"
#include "train/optimizer.h"
#include "train/precision.h"

namespace mgbench::train {
namespace {

/// The loss and metrics of a step's micro-batches, kept on the device until the step's one sync.
struct DeviceSums {
  torch::Tensor loss;        // float64 [1]
  torch::Tensor metrics;     // float64 [metrics]
  torch::Tensor loss_scale;  // amp-fp16: the step's loss scale, float32 []
};

/// Forward and backward of one micro-batch (its tensors on the device); `last`: the step's last,
/// whose backward the gradient all-reduce overlaps.
void forward_backward(LoopParts& p, const data::Batch& input, bool first, bool last, PhaseClock& clock,
                      DeviceSums& sums, StepOutcome& out) {
  clock.enter(results::Phase::kForward);
  MicroBatchLoss loss;
  {
    const AutocastScope autocast(p.precision, p.device.type());
    loss = p.recipe.forward(input);
  }
  clock.enter(results::Phase::kBackward);
  if (last && p.grad_sync) p.grad_sync->prepare();  // DDP's no_sync before the last
  if (p.scaler) {
    // The scale this step uses, read with the loss (no host sync between forward and backward).
    if (first) sums.loss_scale = p.scaler->scale_tensor();
    const torch::Tensor scaled = p.scaler->scale(loss.loss);
    mark_backward(scaled);
    scaled.backward();
  } else {
    mark_backward(loss.loss);
    loss.loss.backward();
  }
  if (p.fsdp) p.fsdp->finish_backward();  // the units' reduce-scatters of this micro-batch, all resharded
  const torch::Tensor value = loss.loss.detach().to(torch::kFloat64).reshape({1});
  sums.loss = sums.loss.defined() ? sums.loss + value : value;
  if (p.metric_count > 0) {
    if (!loss.metrics.defined() || loss.metrics.numel() != p.metric_count) {
      throw std::logic_error("a recipe's forward returned other metrics than its metric_names()");
    }
    const torch::Tensor metrics = loss.metrics.detach().to(torch::kFloat64);
    sums.metrics = sums.metrics.defined() ? sums.metrics + metrics : metrics;
  }
  out.normalizer += loss.normalizer;
  out.record.samples += input.samples;
  out.record.tokens += input.tokens;
  out.record.padded_tokens += input.padded_tokens;
  out.flops += p.recipe.flops(input);
}

/// The factor that makes the gradients summed by backward the step's (after the mean over ranks of
/// the GradSync): 1 / micro-batches for a mean loss, world size / the step's targets on all ranks
/// for a summed one; nullopt when no rank had a target (nothing to learn from). Waiting for the
/// gradient buckets is the allreduce phase (what the all-reduce window covers, nothing else), the
/// normaliser's sum over the ranks the loss_reduce phase.
std::optional<double> gradient_scale(LoopParts& p, const StepOutcome& out, PhaseClock& clock) {
  if (p.grad_sync) {
    clock.enter(results::Phase::kAllreduce);
    p.grad_sync->finish();
  }
  if (p.recipe.loss_normalization() == LossNormalization::kMeanPerMicroBatch) {
    return 1.0 / static_cast<double>(out.micro_batches);
  }
  clock.enter(results::Phase::kLossReduce);
  double all_targets = out.normalizer;  // one rank: its own count, no collective and no host sync
  if (p.comm.world_size() > 1) {
    torch::Tensor targets = torch::full({}, out.normalizer, torch::TensorOptions(torch::kFloat64).device(p.device));
    p.comm.all_reduce(targets, runtime::ReduceOp::kSum)->wait();
    all_targets = targets.cpu().item<double>();
  }
  if (all_targets <= 0) return std::nullopt;  // every label of the step masked
  return static_cast<double>(p.comm.world_size()) / all_targets;
}

/// The gradients scaled by `scale` (the loss normalisation), clipped, and the optimizer step (the
/// GradScaler's with loss scaling). Returns the step's skip flag for the step's one host sync: a
/// float [] tensor, 1 where the scaler skipped the step (non-finite gradients), 0 or undefined where
/// it stepped. The fused AdamW without clipping takes the scaling (and the loss scale's division)
/// inside its kernel, and the skip too: no pass over the gradients and no sync of its own, torch's
/// fused path under GradScaler; clipping needs the true gradients first, and fp64 parameters a
/// divisor of their precision (the kernel's is float32).
torch::Tensor optimizer_step(LoopParts& p, double scale) {
  auto* fused = dynamic_cast<FusedAdamW*>(p.optimizer.get());
  const double max_norm = p.train.clip_grad_norm;
  const bool fp64 = std::any_of(p.trainable.begin(), p.trainable.end(),
                                [](const torch::Tensor& t) { return t.scalar_type() == torch::kFloat64; });
  if (fused != nullptr && max_norm <= 0 && !fp64) {
    torch::Tensor divisor, found_inf;
    if (p.scaler) {
      found_inf = p.scaler->check(*p.optimizer);
      divisor = p.scaler->scale_tensor() / scale;
    } else if (scale != 1.0) {
      divisor = torch::full({}, 1.0 / scale, torch::TensorOptions(torch::kFloat32).device(p.device));
    }
    fused->step_scaled(divisor, found_inf);
    if (p.scaler) p.scaler->update();
    return found_inf;
  }
  if (scale != 1.0) {
    torch::NoGradGuard no_grad;
    for (auto& t : p.trainable) {
      if (t.grad().defined()) t.mutable_grad().mul_(scale);
    }
  }
  if (p.scaler) {
    const torch::Tensor found_inf = p.scaler->unscale(*p.optimizer);  // the true gradients, for clipping
    if (max_norm > 0) clip_grad_norm(p.trainable, max_norm, p.fsdp ? &p.comm : nullptr);
    if (fused != nullptr) {  // the fused kernel skips on the flag: no sync
      fused->step_scaled({}, found_inf);
      p.scaler->update();
      return found_inf;
    }
    const bool stepped = p.scaler->step(*p.optimizer);  // unscaled already: its sync and the step
    p.scaler->update();
    return torch::full({}, stepped ? 0.0 : 1.0);
  }
  if (max_norm > 0) clip_grad_norm(p.trainable, max_norm, p.fsdp ? &p.comm : nullptr);
  p.optimizer->step();
  return {};
}

}  // namespace

StepOutcome train_step(LoopParts& p, DeviceFeeder& feeder, PhaseClock& clock, double lr, std::int64_t global_step) {
  StepOutcome out;
  results::StepRecord& step = out.record;
  set_learning_rate(*p.optimizer, lr);
  step.lr = lr;
  p.recipe.begin_step(global_step);
  p.optimizer->zero_grad(/*set_to_none=*/true);

  const std::int64_t accum = p.train.grad_accum;
  DeviceSums sums;
  while (out.micro_batches < accum) {
    std::optional<data::Batch> batch = feeder.next(clock);
    if (!batch) break;
    ++out.loaded_batches;
    out.loaded_samples += batch->samples;
    out.skipped_images += batch->skipped_images;
    // ddp-rr: this rank loads and transfers the batch but another rank computes it; the time
    // stays on the clock and is charged to the step that follows (or, after the last, the epoch).
    if (!batch->plan.compute) continue;
    if (out.micro_batches == 0) step.batch_index = batch->plan.batch_index;
    if (p.share_buffers()) {
      clock.enter(results::Phase::kBufferBroadcast);
      runtime::broadcast_coalesced(p.comm, p.shared_buffers, 0);
    }
    clock.enter(results::Phase::kTransform);
    const data::Batch input = p.recipe.transform(std::move(*batch));
    forward_backward(p, input, out.micro_batches == 0, out.micro_batches + 1 == accum, clock, sums, out);
    if (p.train.record_indices) {
      out.indices.insert(out.indices.end(), input.plan.indices.begin(), input.plan.indices.end());
    }
    ++out.micro_batches;
  }
  if (out.micro_batches == 0) return out;  // the epoch's plan is done
  if (out.micro_batches != accum) throw std::logic_error("an epoch plan ended inside an optimizer step");

  const std::optional<double> scale = gradient_scale(p, out, clock);
  clock.enter(results::Phase::kOptimizer);
  const torch::Tensor skipped = scale.has_value() ? optimizer_step(p, *scale) : torch::Tensor();
  // This rank's loss per target (per sample for a mean loss), the recipe's metrics and the loss
  // scale: the step's one host sync.
  const std::int64_t metric_count = p.metric_count;
  torch::Tensor on_device = metric_count > 0 ? torch::cat({sums.loss, sums.metrics}) : sums.loss;
  for (const torch::Tensor& more : {sums.loss_scale, skipped}) {
    if (more.defined()) on_device = torch::cat({on_device, more.to(sums.loss.device(), torch::kFloat64).reshape({1})});
  }
  const torch::Tensor values = on_device.cpu();
  step.loss = out.normalizer > 0 ? values[0].item<double>() / out.normalizer : results::kNaN;
  std::int64_t last = values.numel() - 1;
  const bool stepped = scale.has_value() && !(skipped.defined() && values[last--].item<double>() != 0.0);
  if (sums.loss_scale.defined()) step.loss_scale = values[last].item<double>();
  if (scale.has_value() && !stepped) {
    if (auto* fused = dynamic_cast<FusedAdamW*>(p.optimizer.get())) fused->undo_step();
  }
  for (std::int64_t k = 0; k < metric_count; ++k) {
    out.metrics.push_back(values[k + 1].item<double>() / static_cast<double>(out.micro_batches));
  }
  step.phases = clock.take();
  if (p.grad_sync) step.allreduce_window_s = p.grad_sync->window_s();
  if (p.fsdp) {
    const CollectiveTotals c = p.fsdp->take_collectives();
    step.allgather_s = c.allgather_s;
    step.reducescatter_s = c.reducescatter_s;
  }
  step.skipped = stepped ? 0 : 1;
  return out;
}

}  // namespace mgbench::train
