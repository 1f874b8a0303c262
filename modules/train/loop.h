#pragma once
// The training loop: written once, for every recipe (recipe.h). Its lifecycle, in named stages: the
// set-up (the constructor: the recipe's data and model, the run's parallel plan applied to the model
// by train/parallel/parallelize.h, the optimizer); where the run starts (a checkpoint's state, or
// afresh); epochs (epoch.h) of optimizer steps (step.h: the micro-batches, gradient sync,
// normalisation, clipping, the optimizer), each step followed by the step boundary (the agreed stop,
// the checkpoint due), and the epoch's end (its records, the evaluation when due, progress); the
// run's end (run_summary.h: CUDA metrics, the totals of all ranks, the summary, the final
// checkpoint). Phase times come from a PhaseClock (CUDA events on a GPU); steps, epochs and the
// summary go to the ResultsWriter.
//
// The loop never calls MPI itself: collectives go through the Communicator, results through the
// ResultsWriter, the stop agreement and checkpoints through RunControl.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/progress.h"
#include "results/hdf5.h"
#include "results/schema.h"
#include "results/writer.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "train/checkpoint/checkpoint_state.h"
#include "train/checkpoint/run_state.h"
#include "train/recipe.h"
#include "train/train_options.h"

namespace mgbench::train {

struct LoopState;

/// What a rank shares with the other ranks of its node.
struct NodeShare {
  int local_size = 1;                        // ranks on this node (the default thread count)
  host_memory::HostMemoryLimit host_memory;  // this rank's share (session::Connection::host_memory)
};

class TrainingLoop {
 public:
  /// Sets the rank up for the run: process-wide device and math settings, the recipe (its data
  /// and model: Recipe::setup), the parallel plan applied to the model (activation checkpointing,
  /// FSDP), the optimizer, loss scaling, the epoch plan, CUPTI on a GPU.
  /// Collective-free.
  /// Throws ConfigError (a single-process strategy with several ranks, an epoch without an
  /// optimizer step, ...) and whatever the recipe's set-up throws.
  TrainingLoop(const TrainOptions& train, Recipe& recipe, runtime::Communicator& comm,
               runtime::DevicePlacement placement, const NodeShare& node);
  ~TrainingLoop();
  TrainingLoop(const TrainingLoop&) = delete;
  TrainingLoop& operator=(const TrainingLoop&) = delete;

  /// Sizes of this rank's result tables.
  results::RankLayout layout() const;
  /// Run attributes of the loop and the recipe (identical on every rank): the resolved device
  /// and backend, the gradients' dtype, gradient buckets, the recipe's attributes.
  h5::Attributes run_attributes() const;
  /// Rank attributes: device, threads, GPU.
  h5::Attributes rank_attributes() const;

  /// Refuses, before the run is recorded, to continue `from` (a checkpoint of this configuration)
  /// where its world size differs and it stopped inside an epoch whose remaining samples at this
  /// world size are not the same: only DistributedSampler's order over samples (--strategy ddp-ds,
  /// no tar shards) hands the ranks the shuffled indices in turn at any world size; ddp and
  /// ddp-rr cut each batch by the world size, tar shards go to ranks whole. Warns where an epoch
  /// has another number of optimizer steps at the two world sizes (samples not a multiple of the
  /// global batch: the schedule's length changes). Throws ConfigError naming the checkpoint, the
  /// strategy and what would resume it.
  void check_resume(const CheckpointManifest& from) const;
  /// Trains (or, for an evaluate-only recipe, evaluates); writes steps, epochs and (rank 0) the
  /// summary; returns the summary. control: continues from control.resume (released once
  /// loaded; written by control.resume_world_size ranks, other than this run's, at the same sample
  /// of its epoch, RunProgress::continued), writes checkpoints through control.checkpointer (every
  /// --checkpoint-every steps and at the end) and stops at the step boundary control.stop agrees
  /// on: then the epoch's steps so far (and recorded indices) are written, a checkpoint is taken,
  /// control.preempted is set and the partial summary returned (not written).
  /// Throws DataError for a checkpoint that does not fit this run, Error when the loss diverges.
  results::RunSummary run(results::ResultsWriter& writer, Progress& progress, RunControl& control);

  /// One evaluation over the recipe's evaluation set, each rank a contiguous shard, sums reduced
  /// over the ranks (under FSDP each rank runs as many batches as the largest shard). Collective.
  EvalResult evaluate() { return *evaluate(nullptr); }
  /// evaluate(), `stop` (an --eval-only run's: its evaluation is the whole run) polled after each
  /// batch that every rank runs; nullopt where the ranks agreed to stop there (nothing reduced).
  std::optional<EvalResult> evaluate(runtime::StopAgreement* stop);

  /// Copies of the recipe's trainable parameters, whole (gathered from the shards under FSDP: a
  /// collective then). For exports and tests.
  std::vector<torch::Tensor> trained_parameters();
  /// After a completed run, on every rank: the recipe's tensor exports written by rank 0
  /// (write_tensor_exports: under FSDP each unit gathered in turn, a collective, never the whole
  /// model at once), then the recipe's finish (its configuration files).
  void finish(int rank);

  /// This rank's state as a checkpoint holds it: the recipe's checkpoint tensors ("model/<name>"),
  /// the optimizer, the loss scale, the RNGs and where the run stands (RunProgress). What run()
  /// writes at each checkpoint.
  void state_dict(CheckpointState& state) const;
  /// The reverse of state_dict: what run() restores from control.resume before it trains (run()
  /// starts from control.resume or afresh, whatever was loaded before). Throws DataError naming the
  /// file for a missing or malformed entry, or a position outside this run's epochs.
  void load_state_dict(const CheckpointState& state);

  /// The throughput unit of progress lines: "img/s" or "tok/s".
  const char* throughput_unit() const;

 private:
  std::unique_ptr<LoopState> state_;
};

}  // namespace mgbench::train
