#pragma once
// Where a run stands and what controls it at a step boundary: the position a checkpoint carries
// (RunProgress), the preemption and resume handles a job gives the training loop (RunControl),
// and the step boundary itself -- the agreed stop and the checkpoint due.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "results/schema.h"
#include "results/writer.h"
#include "runtime/stop_request.h"
#include "train/checkpoint/checkpoint_state.h"
#include "train/checkpoint/checkpointer.h"

namespace mgbench::train {

/// What a job hands the training loop for preemption and resume. Every pointer may be null.
struct RunControl {
  Checkpointer* checkpointer = nullptr;    // periodic and final checkpoints, and the one at a stop
  runtime::StopAgreement* stop = nullptr;  // polled at every step boundary
  CheckpointState* resume = nullptr;       // the state to continue from; released once loaded
  int resume_world_size = 0;               // the number of ranks that wrote it
  bool preempted = false;                  // out: the run stopped early on a signal
  std::string not_resumable;               // out: why a stopped run cannot be continued ("": it can, or
                                           // no --checkpoint-dir was given)
};

/// Where a run stands at a step boundary, as the training loop keeps it: everything a checkpoint
/// carries besides the model, optimizer, loss scale and RNGs, so that a resumed run continues as if
/// never stopped -- saved and loaded by the two functions side by side below, so that what is saved
/// and what is restored cannot drift apart (torchtitan's Stateful).
struct RunProgress {
  std::int64_t epoch = 0;                  // the epoch in progress (0-based; == epochs when done)
  std::int64_t position = 0;               // within it: plan entries taken
  std::int64_t global_step = 0;            // optimizer steps done over the run
  std::int64_t first_step = 0;             // the global step this run (in the results file) began at: 0, or
                                           // where the run it continues at another world size stopped
  double elapsed_s = 0;                    // run time so far [s], excluding time away while preempted
  double epoch_elapsed_s = 0;              // time in the epoch in progress before this process took it over [s]
  double loss_sum = 0;                     // the epoch's finite step losses
  std::int64_t loss_steps = 0;             // and their number
  results::RunSummary summary;             // accumulated: train_s, eval_s, test_accuracy, final_loss, epochs_completed
  results::EpochRecord epoch_record;       // the epoch in progress
  std::vector<results::StepRecord> steps;  // the epoch's steps so far
  // This rank's totals over the run (the summary's figures of all ranks are their sums).
  std::int64_t computed_samples = 0;  // samples computed on
  std::int64_t real_tokens = 0;       // tokens that are not padding
  std::int64_t padded_tokens = 0;     // tokens with padding (batch x length)
  double flops = 0;                   // model FLOPs
  // --warmup-steps-excluded K: the above and this rank's training time when its K-th optimizer step
  // ended, taken once; the summary's throughput counts what came after.
  struct Warmup {
    bool taken = false;
    double train_s = 0;  // [s]
    std::int64_t samples = 0, real_tokens = 0, padded_tokens = 0;
    double flops = 0;
  } warmup;
  // The epoch in progress's records written at its end.
  std::vector<std::int64_t> computed_indices;  // --record-indices: the samples computed on, in order
  std::vector<double> metric_rows;             // the recipe's per-step metrics, row-major

  void save(CheckpointState& state) const;
  /// Throws DataError naming the file for missing or malformed entries.
  void load(const CheckpointState& state);
  /// Clears the per-epoch part for the next epoch.
  void next_epoch();
  /// Where a run continuing this one at another world size starts (--resume with
  /// --global-batch-size, a run of its own in the results file, train/resume.cpp converts the
  /// position): the epoch, the global step and the epochs completed, at `position` of the epoch's
  /// plan there; the records, times and totals start afresh.
  RunProgress continued(std::int64_t position) const;
};

/// What a checkpoint is written from besides the RunProgress: the state (model, optimizer, loss
/// scale, RNGs: what the training loop's TrainingLoop::state_dict puts into a CheckpointState) and
/// the run's results (its file and run, recorded in the manifest).
struct CheckpointSource {
  const results::ResultsWriter& writer;
  std::function<void(CheckpointState&)> state_dict;
};

/// Writes a checkpoint of source and `progress` when control has a checkpointer; the manifest
/// records progress's position, the writer's results file and run and the agreed stop signal.
/// Collective. A failed save is logged and training goes on (the previous checkpoint stays the
/// latest). False, on every rank, when a save failed.
bool save_checkpoint(RunControl& control, const RunProgress& progress, bool completed, const CheckpointSource& source);

/// The step boundary, after each optimizer step on every rank: polls the agreed stop and writes a
/// checkpoint when one is due (--checkpoint-every) or the run stops. progress.elapsed_s and
/// epoch_elapsed_s are updated for the checkpoint; writing it is not the run's time: epoch_elapsed_s
/// is lowered by its duration and summary.checkpoint_s raised by it (RunSinks::run_time). run_elapsed_s: the run's time
/// so far; epoch_clock_s: time since this process began the epoch. Returns true when the job agreed to stop
/// (control.preempted is then set and the stop is logged). When the stop's checkpoint could not be
/// written, the latest earlier checkpoint of the run is where --resume continues (said so); with
/// none, control.not_resumable says why.
bool at_step_boundary(RunControl& control, RunProgress& progress, const CheckpointSource& source, double run_elapsed_s,
                      double epoch_clock_s);

}  // namespace mgbench::train
