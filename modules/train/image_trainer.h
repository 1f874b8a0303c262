#pragma once
// The image job (Lawenda et al. 2025, sec. 3): MobileNetV2 trained on MNIST upscaled to
// image_size x image_size, its work distributed by strategy, gradients averaged over the
// Communicator, per-step phase times and per-epoch test accuracy written to the results file.
//
// Devices and precision: the rank's device comes from runtime::place_rank; the model is in the
// precision's dtype (precision.h), amp-* runs forward under autocast and amp-fp16 scales the
// loss (GradScaler). On a GPU, batches reach the device through DeviceFeeder (pinned copy
// stream with --pin-memory), phase times come from CUDA events, CUPTI totals of the profile
// window and the allocator's memory peaks go to rank_<r>/cuda_* (device_pipeline.h, profile/).
//
// --strategy dp is the paper's DP baseline in one process (world size 1, the whole batch per
// step): torch.nn.DataParallel's replicate / scatter / parallel forward / gather over every visible
// GPU of the node (data_parallel.h).
//
// Lifecycle: construct -> load_data() -> layout() / run_attributes() (to create the results
// run) -> run(writer). The trainer never calls MPI itself: collectives go through the
// Communicator, results through the ResultsWriter.
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/progress.h"
#include "results/hdf5.h"
#include "results/schema.h"
#include "results/writer.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "train/checkpoint.h"
#include "train/image_config.h"

namespace mgbench::train {

class ImageTrainer {
 public:
  /// local_size: ranks on this node (for the default thread count); placement: this rank's
  /// device. Throws ConfigError for an invalid config (or dp with more than one rank).
  ImageTrainer(ImageConfig config, runtime::Communicator& comm, int local_size,
               runtime::DevicePlacement placement = {});
  ~ImageTrainer();

  /// Reads the training and test sets (DataError naming the file when one is unusable) and
  /// builds the model. Collective-free, so a failure can be agreed on before the run starts.
  void load_data();

  /// Sizes of this rank's result tables.
  results::RankLayout layout() const;
  /// Run-level attributes contributed by the job (identical on every rank).
  h5::Attributes run_attributes() const;
  /// Rank-level attributes (device, threads).
  h5::Attributes rank_attributes() const;

  /// The model's parameters and buffers (valid after load_data()).
  std::vector<torch::Tensor> parameters() const;
  std::vector<torch::Tensor> buffers() const;

  /// Trains and evaluates; writes steps, epochs and (rank 0) the summary. Returns the summary.
  /// control (optional): continues from control->resume, writes checkpoints through
  /// control->checkpointer (every --checkpoint-every steps and at the end), and stops at the step
  /// boundary control->stop agrees on: then the epoch's steps so far are written, a checkpoint is
  /// taken, control->preempted is set and the partial summary returned (not written).
  /// Throws DataError for a checkpoint that does not fit this model or run.
  results::RunSummary run(results::ResultsWriter& writer, Progress& progress, RunControl* control = nullptr);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// The LibTorch version this binary was built against, e.g. "2.11.0".
std::string torch_version();

}  // namespace mgbench::train
