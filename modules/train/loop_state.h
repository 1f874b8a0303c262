#pragma once
// What the training loop (loop.h) holds for a run on this rank, by stage: what the set-up decided
// (RunSetup: fixed from then on), what the steps update (TrainingState: the trained tensors, their
// synchronisation and the optimizer), and where the run stands (RunProgress, what a checkpoint
// carries). The epoch stage (epoch.h), the step (step.h) and the run's end (run_summary.h) read and
// update these. Internal to the loop.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "axes/parallel_plan.h"
#include "axes/precision.h"
#include "data/sampler.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/grad_sync.h"
#include "train/checkpoint/run_state.h"
#include "train/cupti_window.h"
#include "train/optim/grad_scaler.h"
#include "train/parallel/parallelize.h"
#include "train/recipe.h"
#include "train/step_graphs.h"
#include "train/telemetry_window.h"
#include "train/train_options.h"

namespace mgbench::train {

/// The set-up stage's outcome: what this rank runs, where and how, fixed for the run.
struct RunSetup {
  RunSetup(const TrainOptions& train, Recipe& run_recipe, runtime::Communicator& communicator,
           runtime::DevicePlacement where)
      : options(train.for_world(communicator.world_size())),
        recipe(run_recipe),
        comm(communicator),
        placement(where),
        precision(axes::precision_info(train.precision)) {}

  TrainOptions options;  // the job's, at this world size (TrainOptions::for_world)
  Recipe& recipe;
  runtime::Communicator& comm;
  runtime::DevicePlacement placement;
  torch::Device device = torch::kCPU;
  const axes::PrecisionInfo& precision;
  axes::ParallelPlan plan;            // how the model is laid out over the ranks
  int threads = 1;                    // intra-op CPU threads
  data::EpochPlanOptions epoch_plan;  // what data::plan_epoch plans each epoch from
  std::int64_t steps_per_epoch = 0;   // optimizer steps
  std::int64_t metric_count = 0;      // the recipe's per-step metrics (Recipe::metric_names)
  GraphDecision cuda_graphs;          // --cuda-graphs resolved for this run (step_graphs.h)
  /// The recipe's set-up (data read, model built or loaded) and the plan applied, on this rank: its
  /// seconds, and the peak memory when it ended (peak_memory_bytes: the CUDA allocator's on a GPU,
  /// the process's resident set on the CPU) -- what loading a model costs (rank attributes setup_s,
  /// setup_peak_memory_bytes).
  double setup_s = 0;
  std::int64_t setup_peak_memory_bytes = -1;

  int rank() const { return comm.rank(); }
  int world_size() const { return comm.world_size(); }
};

/// What the optimizer steps update, and how the ranks keep it in agreement.
struct TrainingState {
  std::vector<torch::Tensor> trainable;  // what the optimizer updates: the parameters, or their shards (fsdp)
  std::int64_t trainable_numel = 0;      // of the whole trainable parameters
  ParallelizedModel parallel;            // the plan applied: FSDP's units (fully sharded) and collectives
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<GradScaler> scaler;            // amp-fp16
  runtime::GradSyncOptions sync_options;         // DDP's buckets
  std::unique_ptr<runtime::GradSync> grad_sync;  // replicas on several ranks; made when the run starts
  std::vector<torch::Tensor> shared_buffers;     // DDP's broadcast_buffers, before each forward and evaluation
  /// --cuda-graphs on: the micro-batches' graphs (the gradients then live through the run, zeroed in
  /// place before each step: a graph adds into the tensors it was captured with).
  std::unique_ptr<MicroBatchGraphs> graphs;

  FullyShardedUnits* fsdp() const { return parallel.fsdp.get(); }
  /// Whether the buffers are broadcast from rank 0 before each forward and evaluation: shared
  /// buffers on several ranks.
  bool shares_buffers(int world_size) const { return world_size > 1 && !shared_buffers.empty(); }
};

/// A checkpoint written by from_world ranks, other than this run's (a run given
/// --global-batch-size; TrainingLoop::check_resume accepted it), loaded into run: the run continues
/// at the same sample of its epoch (RunProgress::continued), the epoch's earlier steps, metric rows
/// and indices held as placeholders so that its records keep their places in the epoch; a
/// checkpoint at an epoch's last step continues with that epoch's end (nothing of its plan left).
/// Throws DataError naming source for a position that is not at a step boundary. (train/resume.cpp)
void continue_from_world(const RunSetup& setup, RunProgress& run, int from_world, const std::string& source);

/// The loop's whole state on this rank.
struct LoopState {
  LoopState(const TrainOptions& train, Recipe& recipe, runtime::Communicator& comm, runtime::DevicePlacement where)
      : setup(train, recipe, comm, where) {}

  RunSetup setup;
  TrainingState training;
  CuptiWindow cupti;         // GPU runs with --cupti
  TelemetryWindow energy;    // --telemetry other than off
  RunProgress progress;      // where the run stands (what a checkpoint carries besides model and optimizer)
  bool ops_counted = false;  // progress.summary.ops_per_step is this process's final count (epoch.cpp)

  /// The recipe's checkpoint tensors, each sharded parameter replaced by this rank's shard (with
  /// the whole parameter's shape).
  std::vector<CheckpointTensor> checkpoint_tensors() const {
    std::vector<CheckpointTensor> out;
    for (auto& [name, tensor] : setup.recipe.checkpoint_tensors()) {
      torch::Tensor shard;
      if (const FullyShardedUnits* fsdp = training.fsdp()) shard = fsdp->shard_of(tensor);
      if (shard.defined()) {
        out.push_back({name, shard, tensor.sizes().vec()});
      } else {
        out.push_back({name, tensor, {}});
      }
    }
    return out;
  }
};

}  // namespace mgbench::train
