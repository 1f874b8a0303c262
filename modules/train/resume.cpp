// Resuming a checkpoint of another number of ranks (--global-batch-size): whether the epoch in
// progress can continue at this world size (TrainingLoop::check_resume), and the progress it
// continues from (continue_from_world). docs/design.md, "Resuming at another world size".
#include "core/error.h"
#include "core/log.h"
#include "train/loop.h"
#include "train/loop_state.h"

namespace mgbench::train {

void TrainingLoop::check_resume(const CheckpointManifest& from) const {
  const RunSetup& setup = state_->setup;
  if (from.world_size == setup.world_size() || from.position == 0) return;
  const data::EpochPlanOptions& plan = setup.epoch_plan;
  const bool sample_order = plan.strategy == axes::Strategy::kDdpDs && plan.shard_sizes.empty();
  MGBENCH_REQUIRE(sample_order, ConfigError,
                  "--resume: checkpoint '{}' of {} rank(s) stopped inside epoch {}, and with --strategy {}{} the rest "
                  "of that epoch at {} rank(s) is not the same samples; resume it with {} rank(s) (a checkpoint at an "
                  "epoch's end resumes at any number)",
                  from.path, from.world_size, from.epoch + 1, axes::strategy_info(plan.strategy).name,
                  plan.shard_sizes.empty() ? "" : " over tar shards", setup.world_size(), from.world_size);
}

void continue_from_world(const RunSetup& setup, RunProgress& run, int from_world, const std::string& source) {
  run = run.continued(setup.options.for_world(from_world).grad_accum, setup.options.grad_accum, source);
  // The epoch's steps and samples before, placeholders: its step records are numbered, and its
  // rows written, by their place in the epoch (unwritten rows: epoch -1; indices -1).
  const std::int64_t steps_before = run.position / setup.options.grad_accum;
  run.steps.assign(static_cast<std::size_t>(steps_before), results::StepRecord{});
  run.metric_rows.assign(static_cast<std::size_t>(steps_before * setup.metric_count), results::kNaN);
  if (setup.options.record_indices) {
    run.computed_indices.assign(static_cast<std::size_t>(run.position * setup.options.batch_size), -1);
  }
  log::info("resuming a checkpoint of {} rank(s) at {}: {} micro-batches a step, epoch {} from its sample {}",
            from_world, setup.world_size(), setup.options.grad_accum, run.epoch + 1,
            run.position * setup.options.batch_size * setup.world_size());
}

}  // namespace mgbench::train
