// `mgbench image`: option parsing and hand-over to the image job. No logic beyond parsing.
#include "commands.h"
#include "core/error.h"
#include "job_cli.h"
#include "runtime/mpi_env.h"
#include "train/image_config.h"
#include "train/image_job.h"

namespace mgbench::app {
namespace {

po::options_description image_options(train::ImageConfig& c, std::int64_t& seed) {
  po::options_description data("Data");
  // clang-format off: one option per line
  data.add_options()("data", po::value(&c.data_dir)->default_value(c.data_dir),
                     "directory with MNIST-format IDX files (train-images-idx3-ubyte[.gz], t10k-...)")(
      "image-size", po::value(&c.image_size)->default_value(c.image_size),
      "side of the upscaled square images [px] (the paper: 100-700)")(
      "limit-train", po::value(&c.limit_train)->default_value(c.limit_train),
      "use the first N training images (0: all)")("limit-test", po::value(&c.limit_test)->default_value(c.limit_test),
                                                  "use the first N test images (0: all)");
  // clang-format on
  po::options_description dist("Workload distribution");
  // clang-format off: one option per line
  dist.add_options()(
      "strategy", po::value(&c.strategy)->default_value(c.strategy),
      "ddp (every rank the whole dataset) | ddp-rr (all load, round-robin compute) | ddp-ds (DistributedSampler) | "
      "dp (one process)")("epochs", po::value(&c.epochs)->default_value(c.epochs), "training epochs")(
      "batch-size", po::value(&c.batch_size)->default_value(c.batch_size), "samples per step per rank")(
      "shuffle", po::value(&c.shuffle)->default_value(c.shuffle), "reshuffle every epoch (seed + epoch)")(
      "drop-last", po::value(&c.drop_last)->default_value(c.drop_last), "drop the last incomplete batch")(
      "seed", po::value(&seed)->default_value(static_cast<std::int64_t>(c.seed)), "seed of weights and shuffling");
  // clang-format on
  po::options_description compute("Compute");
  // clang-format off: one option per line
  compute.add_options()("device", po::value(&c.device)->default_value(c.device),
                        "auto | cuda | cpu: auto = the GPU of the rank's local rank when GPUs are visible")(
      "backend", po::value(&c.backend)->default_value(c.backend),
      "auto | nccl | mpi: auto = nccl on GPUs, mpi on the CPU (mpi stages GPU tensors through the host)")(
      "precision", po::value(&c.precision)->default_value(c.precision),
      "fp64 | fp32 | tf32 | fp16 | bf16 (whole model in that dtype) | amp-fp16 | amp-bf16 (autocast, fp32 master "
      "weights; amp-fp16 with dynamic loss scaling)")(
      "pin-memory", po::value(&c.pin_memory)->default_value(c.pin_memory),
      "true | false: page-locked host batches, copied on a copy stream ahead of compute (GPU only)")(
      "upscale", po::value(&c.upscale)->default_value(c.upscale),
      "device: 28x28 uint8 crosses PCIe, upscaled on the device | host: the paper's CPU-side resize (float SxS)")(
      "cudnn-benchmark", po::value(&c.cudnn_benchmark)->default_value(c.cudnn_benchmark),
      "true | false: let cuDNN time and pick convolution algorithms (GPU)")(
      "comm-timeout", po::value(&c.comm_timeout_s)->default_value(c.comm_timeout_s),
      "seconds a collective may stay in flight before the job is aborted (NCCL watchdog)")(
      "threads", po::value(&c.threads)->default_value(c.threads),
      "intra-op CPU threads per rank (0: node cores / ranks on the node)")(
      "prefetch", po::value(&c.prefetch)->default_value(c.prefetch), "batches the loader prepares ahead")(
      "channels-last", po::value(&c.channels_last)->default_value(c.channels_last),
      "true | false: NHWC memory layout for activations and conv weights (faster convolutions)")(
      "width-mult", po::value(&c.width_mult)->default_value(c.width_mult), "MobileNetV2 width multiplier")(
      "dropout", po::value(&c.dropout)->default_value(c.dropout), "dropout before the classifier")(
      "freeze-batchnorm", po::value(&c.freeze_batchnorm)->default_value(c.freeze_batchnorm),
      "keep BatchNorm in eval mode while training (batch-independent per-sample maths)");
  // clang-format on
  po::options_description optim("Optimisation");
  // clang-format off: one option per line
  optim.add_options()("optimizer", po::value(&c.optimizer)->default_value(c.optimizer),
                      "sgd (Nesterov momentum) | adamw")("lr", po::value(&c.lr)->default_value(c.lr),
                                                         "peak learning rate")(
      "momentum", po::value(&c.momentum)->default_value(c.momentum), "SGD momentum")(
      "weight-decay", po::value(&c.weight_decay)->default_value(c.weight_decay), "weight decay")(
      "lr-schedule", po::value(&c.lr_schedule)->default_value(c.lr_schedule), "cosine | constant (after warm-up)")(
      "warmup-steps", po::value(&c.warmup_steps)->default_value(c.warmup_steps), "linear warm-up steps")(
      "bucket-mb", po::value(&c.bucket_mb)->default_value(c.bucket_mb), "gradient all-reduce bucket size [MiB]")(
      "first-bucket-mb", po::value(&c.first_bucket_mb)->default_value(c.first_bucket_mb),
      "size of the first bucket [MiB] (small, to start communication early)");
  // clang-format on
  po::options_description output("Evaluation and results");
  // clang-format off: one option per line
  output.add_options()("eval-every", po::value(&c.eval_every)->default_value(c.eval_every),
                       "evaluate every N epochs (and the last)")(
      "results", po::value(&c.results)->default_value(c.results), "HDF5 results file (created or appended to)")(
      "run-name", po::value(&c.run_name)->default_value(c.run_name), "name appended to the run id")(
      "record-indices", po::bool_switch(&c.record_indices), "store the sample indices each rank computed on per epoch")(
      "progress-interval", po::value(&c.progress_interval_s)->default_value(c.progress_interval_s),
      "seconds between progress lines when stderr is not a terminal");
  // clang-format on
  po::options_description profiling("Profiling (GPU runs)");
  // clang-format off: one option per line
  profiling.add_options()("profile-window", po::value(&c.profile_window)->default_value(c.profile_window),
                          "START:DURATION seconds (the paper: 0:720) | steps:FIRST:COUNT | all: when CUPTI collects")(
      "cupti", po::value(&c.cupti)->default_value(c.cupti),
      "true | false: CUDA memcpy / API / kernel totals per rank into the results file")(
      "nvtx", po::value(&c.nvtx)->default_value(c.nvtx),
      "true | false: NVTX ranges around the phases (Nsight Systems)");
  // clang-format on
  po::options_description all(
      "mgbench image: train MobileNetV2 on MNIST upscaled, across MPI ranks.\n"
      "usage: mpirun -np N mgbench image [options]\n");
  all.add(data)
      .add(dist)
      .add(compute)
      .add(optim)
      .add(output)
      .add(profiling)
      .add(checkpoint_options(c.checkpoint))
      .add(job_general_options());
  return all;
}

}  // namespace

int image_main(int argc, char** argv) {
  runtime::MpiEnvironment env(&argc, &argv);
  train::ImageConfig config;
  std::int64_t seed = 0;
  const po::options_description options = image_options(config, seed);
  po::variables_map vm;
  if (auto done = parse_job_options(env, "image", argc, argv, options, vm, [&] {
        MGBENCH_REQUIRE(seed >= 0, ConfigError, "--seed {}: expected >= 0", seed);
        config.seed = static_cast<std::uint64_t>(seed);
        config.validate();
      })) {
    return *done;
  }
  const std::string resolved = announce_job(env, "image", vm);
  if (vm.count("dry-run") != 0) return 0;
  return train::run_image_job(config, env, resolved, join_command_line(argc, argv));
}

}  // namespace mgbench::app
