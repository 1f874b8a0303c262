#pragma once
// The options of the training loop (loop.h), which every recipe shares: workload distribution,
// devices and precision, optimisation, gradient synchronisation, results, profiling and
// checkpoints. Declared once, here, into the job's option table; each recipe has its own defaults
// (RecipeInfo::defaults), so --help shows the recipe's. No torch or MPI.
#include <cstdint>
#include <span>
#include <string>

#include "axes/parallel_plan.h"
#include "axes/precision.h"
#include "axes/strategy.h"
#include "core/option_table.h"
#include "profile/telemetry.h"
#include "runtime/backend.h"
#include "runtime/buckets.h"
#include "runtime/device.h"
#include "train/checkpoint/checkpoint_options.h"
#include "train/optim/optim_options.h"

namespace mgbench::train {

/// --cuda-graphs: whether a GPU rank's micro-batches are captured once per shape and replayed as CUDA
/// graphs (train/step_graphs.h; the choices' help says when each applies).
enum class CudaGraphs { kAuto, kOn, kOff };
std::span<const options::Choice<CudaGraphs>> cuda_graph_choices();

struct TrainOptions {
  // workload distribution
  axes::Strategy strategy = axes::Strategy::kDdpDs;
  std::int64_t epochs = 1;
  std::int64_t batch_size = 1;         // samples per micro-batch per rank
  std::int64_t grad_accum = 1;         // micro-batches per optimizer step (with global_batch_size: for_world's)
  std::int64_t global_batch_size = 0;  // samples per optimizer step over all ranks (0: batch x ranks x grad_accum)
  std::int64_t max_steps = 0;          // optimizer steps per epoch (0: all); TorchTune's max_steps_per_epoch
  bool shuffle = true;
  bool drop_last = false;
  std::uint64_t seed = 42;
  axes::Sharding sharding = axes::Sharding::kNone;
  bool reshard_after_forward = true;  // FSDP2's reshard_after_forward (TorchTune's default True)
  // compute
  runtime::DeviceRequest device = runtime::DeviceRequest::kAuto;
  runtime::Backend backend = runtime::Backend::kAuto;
  axes::Precision precision = axes::Precision::kFp32;
  bool pin_memory = false;  // page-locked host batches, copied on a copy stream (GPU)
  int prefetch = 2;         // batches the loader assembles ahead
  int threads = 0;          // intra-op CPU threads per rank; 0: cores of the node / ranks on the node
  bool cudnn_benchmark = true;
  CudaGraphs cuda_graphs = CudaGraphs::kAuto;
  bool malloc_reuse = true;     // keep freed host memory for the next step (core/host_memory.h)
  double comm_timeout_s = 600;  // a collective in flight longer than this aborts the job (both backends)
  double peak_tflops = 0;       // device peak for MFU; 0: the datasheet value of known GPUs
  OptimizerOptions optim;       // optimisation: optimizer, lr, schedule, clipping (optim/optim_options.h)
  // gradient synchronisation (DDP's bucket_cap_mb and first bucket)
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;
  bool gradient_as_bucket_view = false;  // DDP's: gradients held as views of the buckets
  // evaluation and results
  std::int64_t eval_every = 1;  // epochs; the last epoch is always evaluated
  std::string results = "outputs/results.h5";
  std::string run_name;
  std::int64_t repeat = 1;                 // runs of the job, one after another, each its own run (name suffix -r<i>)
  std::int64_t warmup_steps_excluded = 0;  // optimizer steps left out of the summary's throughput
  bool record_indices = false;
  double progress_interval_s = 10.0;
  // profiling (GPU runs)
  std::string profile_window = "all";  // START:DURATION [s] | steps:FIRST:COUNT | all
  bool cupti = true;
  bool nvtx = true;
  // energy (profile/telemetry.h)
  profile::TelemetryRequest telemetry = profile::TelemetryRequest::kAuto;
  double telemetry_interval_ms = 100;
  CheckpointOptions checkpoint;  // train/checkpoint/checkpoint_options.h

  /// Declares every option above into table (the current values are the defaults).
  void declare(options::OptionTable& table);
  /// The profiling and energy rows of declare().
  void declare_profiling(options::OptionTable& table);
  /// The optimiser's and DDP's gradient buckets' rows of declare().
  void declare_optimisation(options::OptionTable& table);
  /// How this run lays its model out over world_size ranks (axes/parallel_plan.h): --sharding and
  /// --reshard-after-forward with the recipe's activation checkpointing.
  axes::ParallelPlan parallel_plan(int world_size, bool activation_checkpointing) const {
    return {world_size, sharding, reshard_after_forward, activation_checkpointing};
  }
  /// DDP's gradient buckets from --bucket-mb, --first-bucket-mb (at least a byte each: a positive
  /// size too small for one byte still means "one tensor a bucket") and --gradient-as-bucket-view;
  /// with CUDA graphs (a replayed backward runs no hook) the buckets are all-reduced after backward.
  runtime::GradSyncOptions grad_sync_options(bool cuda_graphs) const;
  /// These options at world_size ranks: with --global-batch-size G (torchtitan's
  /// training.global_batch_size), grad_accum = G / (batch_size x world_size), so that a step takes G
  /// samples at any world size and a checkpoint can be resumed at another (checkpointer.h); without
  /// it, as given. Throws ConfigError naming --global-batch-size when G is not a multiple of
  /// batch_size x world_size.
  TrainOptions for_world(int world_size) const;
  /// The rules between options (each option's own bounds are the table's): --sharding fsdp with
  /// a single-process strategy or with loss scaling (amp-fp16) is refused, --repeat above 1 with
  /// checkpoints (a repeated job is not resumable), and --global-batch-size with --grad-accum (the
  /// one derives the other). Throws ConfigError.
  void validate() const;
};

}  // namespace mgbench::train
