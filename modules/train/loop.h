#pragma once
// The training loop: written once, for every recipe (recipe.h).
//
// Per optimizer step, on every rank: the learning rate of the schedule; grad_accum micro-batches,
// each from the loader thread through the device feeder (data and h2d phases), forward under the
// precision's autocast (the recipe's loss; transform and forward phases), backward (scaled with
// amp-fp16), the gradients' bucketed all-reduce overlapped with the last micro-batch's backward
// (GradSync; DDP's no_sync for the earlier ones); the gradients normalised as the recipe's
// LossNormalization says, clipped, the optimizer step (GradScaler's with amp-fp16); then the
// step boundary: the agreed stop and the checkpoint due. Per epoch: the epoch's records, the
// evaluation when due, progress. At the end: CUDA metrics, the summary. Phase times come from a
// PhaseClock (CUDA events on a GPU), the step records and epochs go to the ResultsWriter.
//
// The loop never calls MPI itself: collectives go through the Communicator, results through the
// ResultsWriter, the stop agreement and checkpoints through RunControl.
#include <memory>
#include <string>
#include <vector>

#include "core/progress.h"
#include "results/hdf5.h"
#include "results/schema.h"
#include "results/writer.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "train/recipe.h"
#include "train/run_state.h"
#include "train/train_options.h"

namespace mgbench::train {

class TrainingLoop {
 public:
  /// Sets the rank up for the run: process-wide device and math settings, the recipe (its data
  /// and model: Recipe::setup), the optimizer, loss scaling, the epoch plan, CUPTI on a GPU.
  /// Collective-free. local_size: ranks on this node (for the default thread count).
  /// Throws ConfigError (a single-process strategy with several ranks, an epoch without an
  /// optimizer step, ...) and whatever the recipe's set-up throws.
  TrainingLoop(const TrainOptions& train, Recipe& recipe, runtime::Communicator& comm,
               runtime::DevicePlacement placement, int local_size);
  ~TrainingLoop();
  TrainingLoop(const TrainingLoop&) = delete;
  TrainingLoop& operator=(const TrainingLoop&) = delete;

  /// Sizes of this rank's result tables.
  results::RankLayout layout() const;
  /// Run attributes of the loop and the recipe (identical on every rank): the resolved device
  /// and backend, gradient buckets, the recipe's attributes.
  h5::Attributes run_attributes() const;
  /// Rank attributes: device, threads, GPU.
  h5::Attributes rank_attributes() const;

  /// Trains (or, for an evaluate-only recipe, evaluates); writes steps, epochs and (rank 0) the
  /// summary; returns the summary. control: continues from control.resume, writes checkpoints
  /// through control.checkpointer (every --checkpoint-every steps and at the end) and stops at
  /// the step boundary control.stop agrees on: then the epoch's steps so far are written, a
  /// checkpoint is taken, control.preempted is set and the partial summary returned (not written).
  /// Throws DataError for a checkpoint that does not fit this run, Error when the loss diverges.
  results::RunSummary run(results::ResultsWriter& writer, Progress& progress, RunControl& control);

  /// One evaluation over the recipe's evaluation set, each rank a contiguous shard, sums reduced
  /// over the ranks. Collective.
  EvalResult evaluate();

  /// The throughput unit of progress lines: "img/s" or "tok/s".
  const char* throughput_unit() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace mgbench::train
