#include "train/epoch.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "data/loader.h"
#include "train/loop.h"
#include "train/op_counter.h"
#include "train/optim/lr_schedule.h"

namespace mgbench::train {

std::vector<data::PlannedBatch> cut_plan(std::vector<data::PlannedBatch> plan, std::int64_t micro_batches) {
  std::int64_t computed = 0;
  for (std::size_t k = 0; k < plan.size(); ++k) {
    computed += plan[k].compute ? 1 : 0;
    if (computed == micro_batches) {
      bool more = false;
      for (std::size_t j = k + 1; j < plan.size() && !more; ++j) more = plan[j].compute;
      if (more) plan.resize(k + 1);
      break;
    }
  }
  return plan;
}

std::int64_t op_counted_step(std::int64_t warmup_steps_excluded) {
  return warmup_steps_excluded >= 2 ? warmup_steps_excluded - 1 : 1;
}

void EpochStage::record_step(StepOutcome& out, double step_start) {
  RunProgress& run = state_.progress;
  results::StepRecord& step = out.record;
  results::EpochRecord& epoch_record = run.epoch_record;
  if (state_.training.grad_sync) epoch_record.allreduce_window_s += step.allreduce_window_s;
  epoch_record.allgather_s += step.allgather_s;
  epoch_record.reducescatter_s += step.reducescatter_s;
  epoch_record.skipped_steps += step.skipped;
  step.epoch = static_cast<std::int32_t>(run.epoch);
  step.step = static_cast<std::int64_t>(run.steps.size());
  step.start_s = sinks_.run_time(step_start, run);
  step.step_s = now_s() - step_start;
  if (out.divergence || (!std::isfinite(step.loss) && out.normalizer > 0 && !state_.training.scaler)) {
    const std::string cause =
        out.divergence
            ? divergence_cause(*out.divergence, run.global_step - run.first_step, step.lr)
            : "on this device the loss is read once per step, after its update, so where it was made is not named "
              "(the same configuration on the CPU names it); a lower --lr helps only where the updates are the cause";
    // The epoch's steps so far and the failing one (its loss, its phases): the loss curve into the
    // divergence stays in the file (rows are this rank's own: no other rank takes part).
    run.steps.push_back(step);
    try {
      sinks_.writer.write_steps(run.epoch, run.steps);
    } catch (const std::exception& e) {
      log::warn("the diverged epoch's steps were not written: {}", e.what());
    }
    const std::string what = out.divergence && !out.divergence->non_finite_gradient.empty()
                                 ? fmt::format("gradients became non-finite (loss {})", step.loss)
                                 : fmt::format("loss became {}", step.loss);
    throw Error(fmt::format("{} at epoch {} step {} (lr {}): training diverged: {}", what, run.epoch + 1, step.step + 1,
                            step.lr, cause));
  }
  if (std::isfinite(step.loss)) {  // amp-fp16 steps skipped by the GradScaler have none
    run.loss_sum += step.loss;
    ++run.loss_steps;
  }
  state_.cupti.count(step.start_s, run.global_step, step.samples);
  epoch_record.samples += step.samples;
  epoch_record.phases += step.phases;
  run.real_tokens += step.tokens;
  run.padded_tokens += step.padded_tokens;
  run.flops += out.flops;
  run.metric_rows.insert(run.metric_rows.end(), out.metrics.begin(), out.metrics.end());
  run.computed_indices.insert(run.computed_indices.end(), out.indices.begin(), out.indices.end());
  run.steps.push_back(step);
  ++run.global_step;
}

void EpochStage::take_warmup_when_over() {
  RunProgress& run = state_.progress;
  if (run.global_step - run.first_step != state_.setup.options.warmup_steps_excluded || run.warmup.taken) return;
  run.warmup = {true,
                run.summary.train_s + run.epoch_elapsed_s + epoch_clock_.elapsed(),
                run.computed_samples + run.epoch_record.samples,
                run.real_tokens,
                run.padded_tokens,
                run.flops};
}

void EpochStage::report_step(const StepOutcome& out) {
  const RunSetup& setup = state_.setup;
  const RunProgress& run = state_.progress;
  const std::int64_t total_steps = setup.steps_per_epoch * setup.options.epochs;
  const double elapsed = sinks_.run_time(now_s(), run);
  const double rate = setup.recipe.counts_tokens()
                          ? static_cast<double>(run.real_tokens) / elapsed
                          : static_cast<double>(run.epoch_record.samples) / epoch_clock_.elapsed();
  sinks_.progress.update(
      {static_cast<int>(run.epoch + 1), static_cast<int>(setup.options.epochs), out.record.step + 1,
       setup.steps_per_epoch, out.record.loss, rate, elapsed,
       elapsed / static_cast<double>(run.global_step) * static_cast<double>(total_steps - run.global_step)});
}

bool EpochStage::train() {
  const RunSetup& setup = state_.setup;
  const TrainOptions& options = setup.options;
  RunProgress& run = state_.progress;
  run.epoch_record.epoch = static_cast<std::int32_t>(run.epoch);
  run.steps.reserve(static_cast<std::size_t>(setup.steps_per_epoch));
  std::vector<data::PlannedBatch> plan =
      cut_plan(data::plan_epoch(setup.epoch_plan, run.epoch), setup.steps_per_epoch * options.grad_accum);
  MGBENCH_REQUIRE(run.position <= static_cast<std::int64_t>(plan.size()), DataError,
                  "checkpoint position: {} batches taken of epoch {}, which has {}", run.position, run.epoch + 1,
                  plan.size());
  plan.erase(plan.begin(), plan.begin() + run.position);  // a resumed epoch: the batches not yet taken
  // Page-locked batches only help (and only exist) for copies to a GPU.
  const bool pin = options.pin_memory && setup.device.is_cuda();
  data::BatchLoader loader(
      std::move(plan),
      [&recipe = setup.recipe](const data::PlannedBatch& p, bool pinned) { return recipe.assemble(p, pinned); },
      options.prefetch, pin);
  DeviceFeeder feeder(loader, setup.device, /*async=*/pin, /*depth=*/std::max(2, options.prefetch),
                      [&recipe = setup.recipe](data::Batch b) { return recipe.prepare_on_device(std::move(b)); });
  const std::int64_t total_steps = setup.steps_per_epoch * options.epochs;
  const bool cosine = options.optim.lr_schedule == LrSchedule::kCosine;
  const CheckpointSource checkpoint{sinks_.writer, [this](CheckpointState& state) { loop_.state_dict(state); }};
  while (true) {
    const double step_start = now_s();
    const std::int64_t faults_at_start = host_memory::minor_page_faults();
    state_.cupti.update(sinks_.run_time(step_start, run), run.global_step, setup.device);
    const double lr = lr_at_step(options.optim.lr, run.global_step, options.optim.warmup_steps, total_steps, cosine);
    // The host's ATen ops of one step: op_counted_step's, or with CUDA graphs the first step from
    // there whose micro-batches all replayed without a capture (a warm-up or capture step
    // dispatches the eager step's ops: a capture records them as the eager step launches them).
    std::optional<OpCounter> ops;
    if (!state_.ops_counted && run.global_step - run.first_step >= op_counted_step(options.warmup_steps_excluded)) {
      ops.emplace();
    }
    const MicroBatchGraphs* graphs = state_.training.graphs.get();
    const std::int64_t replays_before = graphs != nullptr ? graphs->replays() : 0;
    const std::int64_t captures_before = graphs != nullptr ? graphs->captures() : 0;
    StepOutcome out = train_step(setup, state_.training, {feeder, clock_}, lr, run.global_step);
    state_.cupti.step_ended();  // what follows until the next step (its record, evaluation, a checkpoint)
    out.record.cuda_graph = graphs == nullptr ? results::kGraphEager
                                              : graph_use(out.micro_batches, graphs->captures() - captures_before,
                                                          graphs->replays() - replays_before);
    if (ops && out.micro_batches > 0) {
      run.summary.ops_per_step = ops->count();
      state_.ops_counted = graphs == nullptr || out.record.cuda_graph == results::kGraphReplayed;
    }
    run.position += out.loaded_batches;
    run.epoch_record.loaded_samples += out.loaded_samples;
    run.epoch_record.skipped_images += out.skipped_images;
    if (out.micro_batches == 0) return true;  // the epoch's plan is done
    out.record.page_faults = host_memory::minor_page_faults() - faults_at_start;
    record_step(out, step_start);
    take_warmup_when_over();
    report_step(out);
    // Step boundary: every rank learns of a stop request at the same step.
    if (at_step_boundary(sinks_.control, run, checkpoint, sinks_.run_time(now_s(), run), epoch_clock_.elapsed())) {
      sinks_.writer.write_steps(run.epoch, run.steps);
      if (setup.metric_count > 0) sinks_.writer.write_metrics(run.epoch, run.metric_rows);
      if (options.record_indices) sinks_.writer.write_indices(run.epoch, run.computed_indices);
      return false;
    }
  }
}

void EpochStage::end() {
  const TrainOptions& options = state_.setup.options;
  RunProgress& run = state_.progress;
  results::EpochRecord& e = run.epoch_record;
  results::RunSummary& summary = run.summary;
  // The end of the epoch's plan (and, ddp-rr, batches loaded after this rank's last computed one)
  // belong to the epoch, not a step: taken here, before evaluation, which is not training time.
  e.phases += clock_.take();
  e.train_s = run.epoch_elapsed_s + epoch_clock_.elapsed();
  // This run's steps: a continuation at another world size holds the epoch's earlier ones as
  // placeholders (epoch -1), which its samples and phases do not count either.
  e.steps =
      std::count_if(run.steps.begin(), run.steps.end(), [](const results::StepRecord& s) { return s.epoch >= 0; });
  e.loss_mean = run.loss_steps == 0 ? results::kNaN : run.loss_sum / static_cast<double>(run.loss_steps);
  e.samples_per_s = static_cast<double>(e.samples) / e.train_s;
  run.computed_samples += e.samples;
  summary.train_s += e.train_s;

  if (state_.setup.recipe.eval_size() > 0 &&
      ((run.epoch + 1) % options.eval_every == 0 || run.epoch + 1 == options.epochs)) {
    const Stopwatch eval_clock;
    const EvalResult result = loop_.evaluate();
    e.eval_s = eval_clock.elapsed();
    e.test_correct = result.correct;
    e.test_samples = result.samples;
    e.test_accuracy = result.accuracy;
    e.eval_loss = result.loss;
    summary.eval_s += e.eval_s;
    summary.test_accuracy = result.accuracy;
    summary.eval_loss = result.loss;
  }
  results::ResultsWriter& writer = sinks_.writer;
  writer.write_steps(run.epoch, run.steps);
  writer.write_epoch(e);
  if (options.record_indices) writer.write_indices(run.epoch, run.computed_indices);
  if (state_.setup.metric_count > 0) writer.write_metrics(run.epoch, run.metric_rows);
  summary.final_loss = e.loss_mean;
  summary.epochs_completed = run.epoch + 1;
  std::int64_t epoch_tokens = 0;
  for (const auto& step : run.steps) epoch_tokens += step.tokens;
  const double rate =
      state_.setup.recipe.counts_tokens() ? static_cast<double>(epoch_tokens) / e.train_s : e.samples_per_s;
  std::string evaluated;
  if (std::isfinite(e.test_accuracy)) {
    evaluated = fmt::format(" | test accuracy {:.2f} % ({}/{})", 100 * e.test_accuracy, e.test_correct, e.test_samples);
  } else if (std::isfinite(e.eval_loss)) {
    evaluated = fmt::format(" | eval loss {:.4f}", e.eval_loss);
  }
  sinks_.progress.message(fmt::format("epoch {}/{}: loss {:.4f} | {:.1f} {} per rank | {:.3f} s/it | train {:.3f} s{}",
                                      run.epoch + 1, options.epochs, e.loss_mean, rate, loop_.throughput_unit(),
                                      e.train_s / static_cast<double>(std::max<std::int64_t>(e.steps, 1)), e.train_s,
                                      evaluated));
  run.next_epoch();
}

}  // namespace mgbench::train
