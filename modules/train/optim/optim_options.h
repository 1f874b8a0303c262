#pragma once
// The optimisation options every recipe shares (section "Optimisation"): the optimizer and its
// hyper-parameters, the learning-rate schedule and gradient clipping. Declared here, next to what
// reads them (optimizer.h, lr_schedule.h); TrainOptions holds them and declares them in its
// section. No torch.
#include <cstdint>
#include <span>

#include "core/option_table.h"

namespace mgbench::train {

enum class OptimizerKind { kSgd, kAdamW };
/// sgd (Nesterov momentum when --momentum > 0; torch.optim.SGD) | adamw (torch.optim.AdamW).
std::span<const options::Choice<OptimizerKind>> optimizer_choices();

enum class LrSchedule { kCosine, kConstant };
/// cosine (TorchTune's get_cosine_schedule_with_warmup) | constant, both after the linear warm-up.
std::span<const options::Choice<LrSchedule>> lr_schedule_choices();

struct OptimizerOptions {
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  double lr = 1e-3;       // the peak learning rate
  double momentum = 0.9;  // sgd
  double weight_decay = 0;
  LrSchedule lr_schedule = LrSchedule::kCosine;
  std::int64_t warmup_steps = 0;  // optimizer steps of the linear warm-up
  double clip_grad_norm = 0;      // 0: no clipping

  /// Declares --optimizer, --lr, --momentum, --weight-decay, --lr-schedule, --warmup-steps and
  /// --clip-grad-norm into table's current section (the current values are the defaults).
  void declare(options::OptionTable& table);
};

}  // namespace mgbench::train
