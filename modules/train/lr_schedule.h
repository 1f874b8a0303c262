#pragma once
// Learning-rate schedules, as functions of the optimizer step.
#include <cstdint>

namespace mgbench::train {

/// Linear warm-up from 0 over warmup_steps, then cosine decay to 0 at total_steps
/// (torchtune's get_cosine_schedule_with_warmup with num_cycles = 0.5).
/// cosine = false: constant after the warm-up. step is 0-based.
double lr_at_step(double base_lr, std::int64_t step, std::int64_t warmup_steps, std::int64_t total_steps, bool cosine);

}  // namespace mgbench::train
