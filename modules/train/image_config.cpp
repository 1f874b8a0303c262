#include "train/image_config.h"

#include "core/error.h"
#include "profile/profile_window.h"
#include "train/precision.h"

namespace mgbench::train {

void ImageConfig::validate() const {
  checkpoint.validate();
  MGBENCH_REQUIRE(image_size >= 1 && image_size <= 4096, ConfigError, "--image-size {}: expected 1-4096 px",
                  image_size);
  MGBENCH_REQUIRE(epochs >= 1, ConfigError, "--epochs {}: expected >= 1", epochs);
  MGBENCH_REQUIRE(batch_size >= 1, ConfigError, "--batch-size {}: expected >= 1", batch_size);
  MGBENCH_REQUIRE(limit_train >= 0, ConfigError, "--limit-train {}: expected >= 0 (0 = all)", limit_train);
  MGBENCH_REQUIRE(limit_test >= 0, ConfigError, "--limit-test {}: expected >= 0 (0 = all)", limit_test);
  MGBENCH_REQUIRE(strategy == "ddp" || strategy == "ddp-rr" || strategy == "ddp-ds" || strategy == "dp", ConfigError,
                  "--strategy '{}': expected ddp, ddp-rr, ddp-ds or dp", strategy);
  MGBENCH_REQUIRE(device == "auto" || device == "cuda" || device == "cpu", ConfigError,
                  "--device '{}': expected auto, cuda or cpu", device);
  MGBENCH_REQUIRE(backend == "auto" || backend == "nccl" || backend == "mpi", ConfigError,
                  "--backend '{}': expected auto, nccl or mpi", backend);
  parse_precision(precision);
  MGBENCH_REQUIRE(upscale == "device" || upscale == "host", ConfigError, "--upscale '{}': expected device or host",
                  upscale);
  MGBENCH_REQUIRE(comm_timeout_s > 0, ConfigError, "--comm-timeout {}: expected > 0 s", comm_timeout_s);
  profile::parse_profile_window(profile_window);
  MGBENCH_REQUIRE(threads >= 0, ConfigError, "--threads {}: expected >= 0 (0 = automatic)", threads);
  MGBENCH_REQUIRE(prefetch >= 1 && prefetch <= 64, ConfigError, "--prefetch {}: expected 1-64 batches", prefetch);
  MGBENCH_REQUIRE(width_mult > 0 && width_mult <= 4, ConfigError, "--width-mult {}: expected (0, 4]", width_mult);
  MGBENCH_REQUIRE(dropout >= 0 && dropout < 1, ConfigError, "--dropout {}: expected [0, 1)", dropout);
  MGBENCH_REQUIRE(optimizer == "sgd" || optimizer == "adamw", ConfigError, "--optimizer '{}': expected sgd or adamw",
                  optimizer);
  MGBENCH_REQUIRE(lr > 0, ConfigError, "--lr {}: expected > 0", lr);
  MGBENCH_REQUIRE(momentum >= 0 && momentum < 1, ConfigError, "--momentum {}: expected [0, 1)", momentum);
  MGBENCH_REQUIRE(weight_decay >= 0, ConfigError, "--weight-decay {}: expected >= 0", weight_decay);
  MGBENCH_REQUIRE(lr_schedule == "cosine" || lr_schedule == "constant", ConfigError,
                  "--lr-schedule '{}': expected cosine or constant", lr_schedule);
  MGBENCH_REQUIRE(warmup_steps >= 0, ConfigError, "--warmup-steps {}: expected >= 0", warmup_steps);
  MGBENCH_REQUIRE(bucket_mb > 0 && first_bucket_mb > 0, ConfigError,
                  "--bucket-mb / --first-bucket-mb: expected > 0 (got {} / {})", bucket_mb, first_bucket_mb);
  MGBENCH_REQUIRE(eval_every >= 1, ConfigError, "--eval-every {}: expected >= 1", eval_every);
  MGBENCH_REQUIRE(!results.empty(), ConfigError, "--results: expected a file path");
  MGBENCH_REQUIRE(progress_interval_s > 0, ConfigError, "--progress-interval {}: expected > 0 s", progress_interval_s);
}

}  // namespace mgbench::train
