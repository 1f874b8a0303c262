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
  if (from.world_size == setup.world_size()) return;
  const data::EpochPlanOptions& plan = setup.epoch_plan;
  // The epoch's optimizer steps at the checkpoint's world size: where the samples do not divide
  // evenly, the ranks' padding (DistributedSampler's) makes another number of steps, and the
  // learning rate schedule, spread over the run's steps, another length.
  data::EpochPlanOptions then = plan;
  then.world_size = static_cast<int>(from.world_size);
  then.rank = 0;
  const std::int64_t then_steps =
      axes::steps_per_epoch(axes::strategy_info(plan.strategy), data::epoch_shape(then),
                            setup.options.for_world(then.world_size).grad_accum, setup.options.max_steps);
  if (then_steps != setup.steps_per_epoch) {
    log::warn(
        "--resume at {} rank(s) from a checkpoint of {}: an epoch has {} optimizer steps here and {} there (the ranks' "
        "padding of {} samples), so the schedule runs over {} steps instead of {} and the run differs from an "
        "uninterrupted one; a number of samples that is a multiple of --global-batch-size {} keeps them equal",
        setup.world_size(), from.world_size, setup.steps_per_epoch, then_steps, plan.dataset_size,
        setup.steps_per_epoch * setup.options.epochs, then_steps * setup.options.epochs,
        setup.options.global_batch_size);
  }
  if (from.position == 0) return;
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
