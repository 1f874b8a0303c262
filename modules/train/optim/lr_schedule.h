#pragma once
// Learning-rate schedules, as functions of the optimizer step.
#include <cstdint>

namespace mgbench::train {

/// Linear warm-up from 0 over warmup_steps, then cosine decay to 0 at total_steps, exactly
/// torchtune's get_cosine_schedule_with_warmup (num_cycles = 0.5) as its recipes step it: the lr of
/// 0-based optimizer step s is base * s / warmup during the warm-up (so the first step has lr 0),
/// then base * 0.5 * (1 + cos(pi * (s - warmup) / (total - warmup))).
/// cosine = false: constant after the warm-up.
double lr_at_step(double base_lr, std::int64_t step, std::int64_t warmup_steps, std::int64_t total_steps, bool cosine);

}  // namespace mgbench::train
