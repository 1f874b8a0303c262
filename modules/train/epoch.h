#pragma once
// The training loop's epoch stage (loop.h): the epoch's optimizer steps (step.h) from its plan, each
// recorded and followed by the step boundary (the agreed stop, the checkpoint due), then the
// epoch's end -- its record, the evaluation when due, its rows written, progress. Internal to the loop.
#include <cstdint>
#include <vector>

#include "core/progress.h"
#include "core/timer.h"
#include "data/sampler.h"
#include "results/writer.h"
#include "train/checkpoint/run_state.h"
#include "train/device_pipeline.h"
#include "train/loop_state.h"
#include "train/step.h"

namespace mgbench::train {

class TrainingLoop;

/// The epoch's plan cut after its last optimizer step's last micro-batch: steps_per_epoch steps
/// of grad_accum computed batches each (micro_batches in all; a --max-steps limit, or computed
/// batches short of a whole step, leave a tail that is not loaded). Without a cut, loads after the
/// last computed batch stay (ddp-rr: another rank computes them).
std::vector<data::PlannedBatch> cut_plan(std::vector<data::PlannedBatch> plan, std::int64_t micro_batches);

/// The step of a run (0-based, counted from its first) whose ATen operators the loop counts into the
/// summary's ops_per_step (train/op_counter.h): the second, past the first step's one-time work (the
/// optimizer's state created), or the last warm-up step where --warmup-steps-excluded leaves 2 or
/// more out of the timing, so that no timed step pays for the counting. With --cuda-graphs on, the
/// loop counts each step from there until one whose micro-batches all replayed (the last counted
/// stands when none does).
std::int64_t op_counted_step(std::int64_t warmup_steps_excluded);

/// Where the run's epochs report to, for the whole run.
struct RunSinks {
  results::ResultsWriter& writer;  // steps, epochs, metrics, indices (and rank 0 the summary)
  Progress& progress;              // rank 0's progress lines
  RunControl& control;             // the stop agreement and checkpoints
  double run_start_s = 0;          // the run's start on now_s()'s clock (earlier by the time before a resume)
  double checkpoint_s_before = 0;  // the run's checkpoint writing before this process took it over [s]

  /// t (on now_s()'s clock) as the run's time [s]: since its start, less the time away before a
  /// resume and the checkpoints written at step boundaries (run.summary.checkpoint_s), which are not
  /// the run's time (docs/results-schema.md).
  double run_time(double t, const RunProgress& run) const {
    return t - run_start_s - (run.summary.checkpoint_s - checkpoint_s_before);
  }
};

/// One epoch of the run, from where its progress stands (a resumed epoch continues at its position).
class EpochStage {
 public:
  /// loop: for its state_dict (checkpoints) and evaluate(). clock: the run's phase clock.
  EpochStage(LoopState& state, TrainingLoop& loop, PhaseClock& clock, const RunSinks& sinks)
      : state_(state), loop_(loop), clock_(clock), sinks_(sinks) {}

  /// The epoch's steps, each followed by the step boundary. False when the job agreed to stop: the
  /// epoch's steps so far are written (its row is written when it ends, after a resume). Throws
  /// DataError for a checkpoint position outside the epoch, Error when the loss diverges.
  bool train();
  /// The epoch's end: its record, the evaluation when due, its rows written, progress; the run's
  /// progress then stands at the next epoch.
  void end();

 private:
  /// A step's outcome into the run's records; throws Error when the loss diverged.
  void record_step(StepOutcome& out, double step_start);
  /// --warmup-steps-excluded: the run's totals when the warm-up's last step ended, taken once.
  void take_warmup_when_over();
  /// Progress after a step (the rate, the time left).
  void report_step(const StepOutcome& out);

  LoopState& state_;
  TrainingLoop& loop_;
  PhaseClock& clock_;
  const RunSinks& sinks_;
  const Stopwatch epoch_clock_;  // since this process began the epoch
};

}  // namespace mgbench::train
