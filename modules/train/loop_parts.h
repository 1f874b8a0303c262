#pragma once
// What the training loop (loop.h) holds for a run on this rank, set up by its constructor and used by
// its phases: the step (step.h), the epochs and the run's end (loop.cpp). Internal to the loop.
#include <cmath>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "axes/precision.h"
#include "data/sampler.h"
#include "profile/cupti_collector.h"
#include "profile/profile_window.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/grad_sync.h"
#include "train/checkpoint/run_state.h"
#include "train/grad_scaler.h"
#include "train/recipe.h"
#include "train/sharding.h"
#include "train/train_options.h"

namespace mgbench::train {

/// CUPTI collecting while --profile-window is open, checked at step boundaries (GPU runs). Times
/// are seconds into the run.
class CuptiWindow {
 public:
  void set(std::unique_ptr<profile::CuptiCollector> cupti, profile::ProfileWindow window) {
    cupti_ = std::move(cupti);
    window_ = window;
  }
  profile::CuptiCollector* collector() const { return cupti_.get(); }
  /// Whether the window holds a step that starts elapsed_s into the run, at global step `step`.
  bool contains(double elapsed_s, std::int64_t step) const { return window_.contains(elapsed_s, step); }
  /// Before global step `step`, starting elapsed_s into the run that started at run_start_s: opens
  /// or closes the window (once closed, it stays closed).
  void update(double elapsed_s, std::int64_t step, const torch::Device& device, double run_start_s);
  /// At the end of the run: closes the window if still open.
  void close(const torch::Device& device, double run_start_s);
  /// Counts a step's samples when it started inside the window (the samples the CUDA metrics cover).
  void count(double start_s, std::int64_t step, std::int64_t samples) {
    if (contains(start_s, step)) samples_ += samples;
  }
  double opened_s() const { return opened_s_; }  // NaN: never opened
  double closed_s() const { return closed_s_; }  // NaN: never closed
  std::int64_t samples() const { return samples_; }

 private:
  std::unique_ptr<profile::CuptiCollector> cupti_;
  profile::ProfileWindow window_;
  double opened_s_ = NAN;
  double closed_s_ = NAN;
  std::int64_t samples_ = 0;  // of this process's steps (not carried over a resume)
};

struct LoopParts {
  LoopParts(const TrainOptions& t, Recipe& r, runtime::Communicator& c, runtime::DevicePlacement p)
      : train(t), recipe(r), comm(c), placement(p), precision(axes::precision_info(t.precision)) {}

  TrainOptions train;
  Recipe& recipe;
  runtime::Communicator& comm;
  runtime::DevicePlacement placement;
  torch::Device device = torch::kCPU;
  const axes::PrecisionInfo& precision;
  int threads = 1;
  CuptiWindow cupti;                        // GPU runs with --cupti
  std::unique_ptr<GradScaler> scaler;       // amp-fp16
  std::vector<torch::Tensor> trainable;     // what the optimizer updates: the parameters, or their shards (fsdp)
  std::int64_t trainable_numel = 0;         // of the whole trainable parameters
  std::unique_ptr<FullyShardedUnits> fsdp;  // --sharding fsdp on several ranks
  MicroBatchCollectives fsdp_collectives;   // --sharding fsdp: a micro-batch's collectives at any world size, unpadded
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  runtime::GradSyncOptions sync_options;
  std::unique_ptr<runtime::GradSync> grad_sync;  // several ranks; made when the run starts
  std::vector<torch::Tensor> shared_buffers;     // DDP's broadcast_buffers, before each forward and evaluation
  data::EpochPlanOptions plan_options;
  std::int64_t steps_per_epoch = 0;
  std::int64_t metric_count = 0;  // the recipe's per-step metrics (Recipe::metric_names)
  RunProgress progress;           // where the run stands (what a checkpoint carries besides model and optimizer)

  bool distributed() const { return comm.world_size() > 1; }
  bool share_buffers() const { return distributed() && !shared_buffers.empty(); }
  /// The recipe's checkpoint tensors, each sharded parameter replaced by this rank's shard.
  std::vector<std::pair<std::string, torch::Tensor>> checkpoint_tensors() const {
    auto tensors = recipe.checkpoint_tensors();
    if (fsdp) {
      for (auto& item : tensors) {
        if (torch::Tensor shard = fsdp->shard_of(item.second); shard.defined()) item.second = shard;
      }
    }
    return tensors;
  }
};

/// CUPTI's collector for a GPU run with --cupti, unless another profiler (nsys) holds CUPTI (then
/// nullptr, with a warning from rank 0); nullptr on the CPU and without --cupti.
std::unique_ptr<profile::CuptiCollector> make_cupti(const LoopParts& s);

}  // namespace mgbench::train
