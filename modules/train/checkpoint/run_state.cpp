#include "train/checkpoint/run_state.h"

#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"

namespace mgbench::train {

// --- run progress ------------------------------------------------------------------------------

void RunProgress::save(CheckpointState& c) const {
  c.put("epoch", epoch);
  c.put("position", position);
  c.put("global_step", global_step);
  c.put("first_step", first_step);
  c.put("elapsed_s", elapsed_s);
  c.put("epoch_elapsed_s", epoch_elapsed_s);
  c.put("loss_sum", loss_sum);
  c.put("loss_steps", loss_steps);
  c.put_records<results::RunSummary>("records/summary", {&summary, 1});
  c.put_records<results::EpochRecord>("records/epoch", {&epoch_record, 1});
  c.put_records<results::StepRecord>("records/steps", steps);
  c.put("computed_samples", computed_samples);
  c.put("real_tokens", real_tokens);
  c.put("padded_tokens", padded_tokens);
  c.put("flops", flops);
  c.put("warmup/taken", std::int64_t{warmup.taken ? 1 : 0});
  c.put("warmup/train_s", warmup.train_s);
  c.put("warmup/samples", warmup.samples);
  c.put("warmup/real_tokens", warmup.real_tokens);
  c.put("warmup/padded_tokens", warmup.padded_tokens);
  c.put("warmup/flops", warmup.flops);
  c.put_records<std::int64_t>("records/indices", computed_indices);
  c.put_records<double>("records/metrics", metric_rows);
}

void RunProgress::load(const CheckpointState& c) {
  epoch = c.integer("epoch");
  position = c.integer("position");
  global_step = c.integer("global_step");
  first_step = c.integer("first_step");
  elapsed_s = c.number("elapsed_s");
  epoch_elapsed_s = c.number("epoch_elapsed_s");
  loss_sum = c.number("loss_sum");
  loss_steps = c.integer("loss_steps");
  const auto summaries = c.records<results::RunSummary>("records/summary");
  const auto epochs = c.records<results::EpochRecord>("records/epoch");
  MGBENCH_REQUIRE(summaries.size() == 1 && epochs.size() == 1 && epoch >= 0 && position >= 0 && global_step >= 0 &&
                      first_step >= 0 && first_step <= global_step,
                  DataError, "checkpoint '{}': malformed run position", c.source());
  summary = summaries[0];
  epoch_record = epochs[0];
  steps = c.records<results::StepRecord>("records/steps");
  computed_samples = c.integer("computed_samples");
  real_tokens = c.integer("real_tokens");
  padded_tokens = c.integer("padded_tokens");
  flops = c.number("flops");
  warmup.taken = c.integer("warmup/taken") != 0;
  warmup.train_s = c.number("warmup/train_s");
  warmup.samples = c.integer("warmup/samples");
  warmup.real_tokens = c.integer("warmup/real_tokens");
  warmup.padded_tokens = c.integer("warmup/padded_tokens");
  warmup.flops = c.number("warmup/flops");
  computed_indices = c.records<std::int64_t>("records/indices");
  metric_rows = c.records<double>("records/metrics");
}

void RunProgress::next_epoch() {
  position = 0;
  epoch_elapsed_s = 0;
  loss_sum = 0;
  loss_steps = 0;
  epoch_record = {};
  steps.clear();
  computed_indices.clear();
  metric_rows.clear();
}

RunProgress RunProgress::continued(std::int64_t position) const {
  RunProgress next;
  next.epoch = epoch;
  next.position = position;
  next.global_step = global_step;
  next.first_step = global_step;
  next.summary.epochs_completed = summary.epochs_completed;
  next.summary.test_accuracy = summary.test_accuracy;
  next.summary.final_loss = summary.final_loss;
  next.summary.train_s = 0;
  next.summary.eval_s = 0;
  next.summary.checkpoint_s = 0;
  return next;
}

bool save_checkpoint(RunControl& control, const RunProgress& progress, bool completed, const CheckpointSource& source) {
  if (control.checkpointer == nullptr || !control.checkpointer->enabled()) return true;
  CheckpointState state;
  source.state_dict(state);
  CheckpointManifest m = control.checkpointer->manifest(progress.global_step, progress.epoch, completed);
  m.position = progress.position;
  // Absolute: a --resume from another working directory finds the run's file (std::filesystem::absolute
  // does not touch the file system).
  m.results = std::filesystem::absolute(source.writer.path()).lexically_normal().string();
  m.run_id = source.writer.run_id();
  if (control.stop != nullptr && control.stop->agreed_signal() != 0) {
    m.stop_signal = runtime::stop_signal_name(control.stop->agreed_signal());
  }
  if (control.checkpointer->save(m, state)) return true;
  log::warn("checkpoint at global step {} not written; the previous one stays the latest", progress.global_step);
  return false;
}

bool at_step_boundary(RunControl& control, RunProgress& progress, const CheckpointSource& source, double run_elapsed_s,
                      double epoch_clock_s) {
  const bool stop = control.stop != nullptr && control.stop->poll();
  bool saved = true;
  if (stop || (control.checkpointer != nullptr && control.checkpointer->due(progress.global_step))) {
    const double epoch_elapsed_before = progress.epoch_elapsed_s;
    const Stopwatch checkpoint_clock;
    progress.elapsed_s = run_elapsed_s;
    progress.epoch_elapsed_s = epoch_elapsed_before + epoch_clock_s;
    saved = save_checkpoint(control, progress, /*completed=*/false, source);
    const double writing_s = checkpoint_clock.elapsed();
    progress.epoch_elapsed_s = epoch_elapsed_before - writing_s;
    progress.summary.checkpoint_s += writing_s;
  }
  if (!stop) return false;
  control.preempted = true;
  const std::string stopped = fmt::format("stopped on {} after global step {} (epoch {}, step {})",
                                          runtime::stop_signal_name(control.stop->agreed_signal()),
                                          progress.global_step, progress.epoch + 1, progress.steps.size());
  if (control.checkpointer == nullptr || !control.checkpointer->enabled()) {
    log::info("{}: no --checkpoint-dir, nothing to resume from", stopped);
    return true;
  }
  const std::string resume = fmt::format("--resume --checkpoint-dir {}", control.checkpointer->options().dir);
  if (saved) {
    log::info("{}: continue with {}", stopped, resume);
    return true;
  }
  // The stop's checkpoint failed (a full disk, a quota): --resume continues from the latest one
  // written before, if this run has one; else nothing can be continued and the job must not say so.
  const std::optional<CheckpointManifest> earlier = control.checkpointer->latest();
  std::error_code ec;
  if (earlier && earlier->run_id == source.writer.run_id() &&
      std::filesystem::equivalent(earlier->results, source.writer.path(), ec)) {
    log::warn(
        "{}; its checkpoint could not be written: {} continues from the earlier checkpoint at global step {} "
        "({}), repeating the steps since",
        stopped, resume, earlier->global_step, earlier->path);
    return true;
  }
  control.not_resumable = fmt::format(
      "{}; its checkpoint could not be written and the run has no earlier one in {}: nothing to resume (a --resume "
      "would start a new run)",
      stopped, control.checkpointer->directory());
  log::error("{}", control.not_resumable);
  return true;
}

}  // namespace mgbench::train
