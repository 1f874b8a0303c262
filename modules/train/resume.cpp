// Resuming a checkpoint of another number of ranks (--global-batch-size): whether the epoch in
// progress can continue at this world size (TrainingLoop::check_resume), and the progress it
// continues from (continue_from_world). docs/design.md, "Resuming at another world size".
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "train/epoch.h"
#include "train/loop.h"
#include "train/loop_state.h"

namespace mgbench::train {

namespace {

/// An epoch as a checkpoint's world size cut it: one rank's plan options, the optimizer steps of
/// an epoch and the micro-batches of a step there.
struct WorldEpoch {
  data::EpochPlanOptions plan;
  std::int64_t steps = 0;
  std::int64_t grad_accum = 1;
};

WorldEpoch epoch_at_world(const RunSetup& setup, int world_size, int rank) {
  WorldEpoch at{setup.epoch_plan, 0, setup.options.for_world(world_size).grad_accum};
  at.plan.world_size = world_size;
  at.plan.rank = rank;
  at.steps = axes::steps_per_epoch(axes::strategy_info(at.plan.strategy), data::epoch_shape(at.plan), at.grad_accum,
                                   setup.options.max_steps);
  return at;
}

/// Whether the first `position` batches of the epoch's plan took all of its optimizer steps: a
/// checkpoint at an epoch's last step, written before the epoch's end (its records, its
/// evaluation) ran. Any strategy resumes such a checkpoint at another world size.
bool epoch_trained(const WorldEpoch& at, std::int64_t epoch, std::int64_t position) {
  const std::vector<data::PlannedBatch> plan = cut_plan(data::plan_epoch(at.plan, epoch), at.steps * at.grad_accum);
  if (position <= 0 || position > static_cast<std::int64_t>(plan.size())) return false;
  return std::none_of(plan.begin() + position, plan.end(), [](const data::PlannedBatch& b) { return b.compute; });
}

}  // namespace

void TrainingLoop::check_resume(const CheckpointManifest& from) const {
  const RunSetup& setup = state_->setup;
  if (from.world_size == setup.world_size()) return;
  const data::EpochPlanOptions& plan = setup.epoch_plan;
  // The epoch's optimizer steps at the checkpoint's world size: where the samples do not divide
  // evenly, the ranks' padding (DistributedSampler's) makes another number of steps, and the
  // learning rate schedule, spread over the run's steps, another length. The manifest's position
  // is rank 0's.
  const WorldEpoch then = epoch_at_world(setup, static_cast<int>(from.world_size), 0);
  if (then.steps != setup.steps_per_epoch) {
    log::warn(
        "--resume at {} rank(s) from a checkpoint of {}: an epoch has {} optimizer steps here and {} there (the ranks' "
        "padding of {} samples), so the schedule runs over {} steps instead of {} and the run differs from an "
        "uninterrupted one; a number of samples that is a multiple of --global-batch-size {} keeps them equal",
        setup.world_size(), from.world_size, setup.steps_per_epoch, then.steps, plan.dataset_size,
        setup.steps_per_epoch * setup.options.epochs, then.steps * setup.options.epochs,
        setup.options.global_batch_size);
  }
  if (from.position == 0 || epoch_trained(then, from.epoch, from.position)) return;
  const bool sample_order = plan.strategy == axes::Strategy::kDdpDs && plan.shard_sizes.empty();
  MGBENCH_REQUIRE(sample_order, ConfigError,
                  "--resume: checkpoint '{}' of {} rank(s) stopped inside epoch {}, and with --strategy {}{} the rest "
                  "of that epoch at {} rank(s) is not the same samples; resume it with {} rank(s) (a checkpoint at an "
                  "epoch's end resumes at any number)",
                  from.path, from.world_size, from.epoch + 1, axes::strategy_info(plan.strategy).name,
                  plan.shard_sizes.empty() ? "" : " over tar shards", setup.world_size(), from.world_size);
}

void continue_from_world(const RunSetup& setup, RunProgress& run, int from_world, const std::string& source) {
  const TrainOptions& options = setup.options;
  // This rank's progress is old rank (rank mod from_world)'s (reshard_checkpoint).
  const WorldEpoch then = epoch_at_world(setup, from_world, setup.rank() % from_world);
  std::int64_t position = 0;
  std::int64_t steps_before = 0;
  if (epoch_trained(then, run.epoch, run.position)) {
    // Every step of the epoch was taken there: nothing of its plan is left to load here, and this
    // run ends the epoch (its records and evaluation) before the next one. It took none of the
    // epoch's steps itself: no placeholders (the epoch has another number of steps here).
    position = static_cast<std::int64_t>(
        cut_plan(data::plan_epoch(setup.epoch_plan, run.epoch), setup.steps_per_epoch * options.grad_accum).size());
  } else {
    MGBENCH_REQUIRE(run.position % then.grad_accum == 0, DataError,
                    "checkpoint '{}': position {} in epoch {} is not a step boundary of {} micro-batches", source,
                    run.position, run.epoch + 1, then.grad_accum);
    steps_before = run.position / then.grad_accum;
    position = steps_before * options.grad_accum;
  }
  run = run.continued(position);
  // The epoch's steps and samples before, placeholders: its step records are numbered, and its
  // rows written, by their place in the epoch (unwritten rows: epoch -1; indices -1).
  run.steps.assign(static_cast<std::size_t>(steps_before), results::StepRecord{});
  run.metric_rows.assign(static_cast<std::size_t>(steps_before * setup.metric_count), results::kNaN);
  if (options.record_indices) {
    run.computed_indices.assign(static_cast<std::size_t>(steps_before * options.grad_accum * options.batch_size), -1);
  }
  const std::string where =
      steps_before == 0 && position > 0
          ? fmt::format("epoch {} at its end (its steps were all taken)", run.epoch + 1)
          : fmt::format("epoch {} from its sample {}", run.epoch + 1,
                        steps_before * options.grad_accum * options.batch_size * setup.world_size());
  log::info("resuming a checkpoint of {} rank(s) at {}: {} micro-batches a step, {}", from_world, setup.world_size(),
            options.grad_accum, where);
}

}  // namespace mgbench::train
