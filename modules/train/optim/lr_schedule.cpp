#include "train/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mgbench::train {

double lr_at_step(double base_lr, std::int64_t step, std::int64_t warmup_steps, std::int64_t total_steps, bool cosine) {
  if (step < warmup_steps) return base_lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  if (!cosine) return base_lr;
  const double span = static_cast<double>(std::max<std::int64_t>(total_steps - warmup_steps, 1));
  const double progress = std::clamp(static_cast<double>(step - warmup_steps) / span, 0.0, 1.0);
  return base_lr * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace mgbench::train
