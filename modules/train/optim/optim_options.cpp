#include "train/optim/optim_options.h"

#include <limits>

namespace mgbench::train {
namespace {

using options::Choice;

constexpr Choice<OptimizerKind> kOptimizers[] = {
    {"sgd", OptimizerKind::kSgd, "SGD, Nesterov momentum when --momentum > 0 (torch.optim.SGD)"},
    {"adamw", OptimizerKind::kAdamW, "AdamW (torch.optim.AdamW; TorchTune's LoRA recipes)"},
};

constexpr Choice<LrSchedule> kLrSchedules[] = {
    {"cosine", LrSchedule::kCosine, "cosine decay to 0 at the last step (TorchTune's get_cosine_schedule_with_warmup)"},
    {"constant", LrSchedule::kConstant, "the peak --lr throughout"},
};

}  // namespace

std::span<const Choice<OptimizerKind>> optimizer_choices() { return kOptimizers; }
std::span<const Choice<LrSchedule>> lr_schedule_choices() { return kLrSchedules; }

void OptimizerOptions::declare(options::OptionTable& t) {
  // The optimizers' kernels (the fused AdamW's, GradScaler's unscale) take these as float32: a larger
  // value failed the run at its first step ("value cannot be converted to type float").
  constexpr double kFloat32Max = std::numeric_limits<float>::max();
  t.add("optimizer", optimizer, optimizer_choices(), "the optimizer of the trainable parameters");
  t.add("lr", lr, "peak learning rate").above(0).at_most(kFloat32Max).same_workload();
  t.add("momentum", momentum, "SGD momentum")
      .at_least(0)
      .below(1)
      .same_workload()
      .only_with([this] { return optimizer == OptimizerKind::kSgd; }, "--optimizer sgd");
  t.add("weight-decay", weight_decay, "weight decay").at_least(0).at_most(kFloat32Max).same_workload();
  t.add("lr-schedule", lr_schedule, lr_schedule_choices(), "learning rate after the warm-up").same_workload();
  t.add("warmup-steps", warmup_steps, "linear warm-up from 0 over this many optimizer steps")
      .at_least(0)
      .same_workload();
  t.add("clip-grad-norm", clip_grad_norm, "clip the gradients' global L2 norm to this (0: off)")
      .at_least(0)
      .at_most(kFloat32Max)
      .same_workload();
}

}  // namespace mgbench::train
