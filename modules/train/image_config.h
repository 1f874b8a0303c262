#pragma once
// Resolved configuration of `mgbench image`: built once from the config file and command
// line (app/), validated, then read-only. No torch or MPI here.
#include <cstdint>
#include <string>

#include "train/checkpoint_options.h"

namespace mgbench::train {

struct ImageConfig {
  // data
  std::string data_dir = "inputs/mnist";
  std::int64_t image_size = 100;  // px, square; the paper used 100-700
  std::int64_t limit_train = 0;   // 0: all training samples
  std::int64_t limit_test = 0;    // 0: all test samples
  // workload distribution
  std::string strategy = "ddp-ds";  // ddp | ddp-rr | ddp-ds | dp (one process; see image_trainer.h)
  std::int64_t epochs = 20;
  std::int64_t batch_size = 64;  // per rank
  bool shuffle = true;
  bool drop_last = false;
  std::uint64_t seed = 42;
  // compute
  std::string device = "auto";     // auto | cuda | cpu
  std::string backend = "auto";    // auto | nccl | mpi
  std::string precision = "fp32";  // fp64 | fp32 | tf32 | fp16 | bf16 | amp-fp16 | amp-bf16 (precision.h)
  bool pin_memory = false;
  std::string upscale = "device";  // device: uint8 28x28 crosses PCIe, upscaled there | host: the paper's float SxS
  bool cudnn_benchmark = true;     // cuDNN autotuning of convolution algorithms (GPU)
  double comm_timeout_s = 600;     // a collective in flight longer than this aborts the job (NCCL)
  int threads = 0;                 // intra-op threads per rank; 0: cores of the node / ranks on the node
  int prefetch = 2;                // batches the loader assembles ahead
  bool channels_last = true;       // NHWC activations and conv weights (oneDNN on CPU, tensor cores on GPU)
  // model
  double width_mult = 1.0;
  double dropout = 0.2;
  bool freeze_batchnorm = false;
  // optimisation
  std::string optimizer = "sgd";  // sgd | adamw
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 4e-5;
  std::string lr_schedule = "cosine";  // cosine | constant
  std::int64_t warmup_steps = 0;
  // gradient synchronisation
  double bucket_mb = 25.0;
  double first_bucket_mb = 1.0;
  // evaluation and output
  std::int64_t eval_every = 1;  // epochs; the last epoch is always evaluated
  std::string results = "outputs/results.h5";
  CheckpointOptions checkpoint;  // --checkpoint-dir, --checkpoint-every, --resume
  std::string run_name;
  bool record_indices = false;
  double progress_interval_s = 10.0;
  // profiling (GPU runs)
  std::string profile_window = "all";  // START:DURATION [s] | steps:FIRST:COUNT | all
  bool cupti = true;                   // CUDA activity totals into the results file
  bool nvtx = true;                    // NVTX ranges around the phases

  /// Throws ConfigError naming the first invalid option and what it expects.
  void validate() const;
};

}  // namespace mgbench::train
