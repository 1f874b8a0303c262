#include "train/llm_config.h"

#include "core/error.h"

namespace mgbench::train {

void LlmConfig::validate() const {
  checkpoint.validate();
  MGBENCH_REQUIRE(!model.empty(), ConfigError, "--model: expected a preset name or a checkpoint directory");
  MGBENCH_REQUIRE(init == "checkpoint" || init == "random", ConfigError, "--init '{}': expected checkpoint or random",
                  init);
  MGBENCH_REQUIRE(
      dataset == "alpaca" || dataset == "grammar" || dataset == "samsum" || dataset == "slimorca" || dataset == "text",
      ConfigError, "--dataset '{}': expected alpaca, grammar, samsum, slimorca or text", dataset);
  MGBENCH_REQUIRE(!data.empty(), ConfigError, "--data: expected the dataset file (.json, .jsonl, .csv, .tsv)");
  MGBENCH_REQUIRE(max_seq_len >= 0, ConfigError, "--max-seq-len {}: expected >= 0 (0 = no truncation)", max_seq_len);
  MGBENCH_REQUIRE(limit >= 0, ConfigError, "--limit {}: expected >= 0", limit);
  MGBENCH_REQUIRE(batch_size >= 1, ConfigError, "--batch-size {}: expected >= 1", batch_size);
  MGBENCH_REQUIRE(grad_accum >= 1, ConfigError, "--grad-accum {}: expected >= 1", grad_accum);
  MGBENCH_REQUIRE(epochs >= 1, ConfigError, "--epochs {}: expected >= 1", epochs);
  MGBENCH_REQUIRE(max_steps >= 0, ConfigError, "--max-steps {}: expected >= 0 (0 = the whole epoch)", max_steps);
  MGBENCH_REQUIRE(lr > 0, ConfigError, "--lr {}: expected > 0", lr);
  MGBENCH_REQUIRE(weight_decay >= 0, ConfigError, "--weight-decay {}: expected >= 0", weight_decay);
  MGBENCH_REQUIRE(warmup_steps >= 0, ConfigError, "--warmup-steps {}: expected >= 0", warmup_steps);
  MGBENCH_REQUIRE(clip_grad_norm >= 0, ConfigError, "--clip-grad-norm {}: expected >= 0 (0 = off)", clip_grad_norm);
  MGBENCH_REQUIRE(lora_rank >= 1, ConfigError, "--lora-rank {}: expected >= 1", lora_rank);
  MGBENCH_REQUIRE(lora_alpha > 0, ConfigError, "--lora-alpha {}: expected > 0", lora_alpha);
  MGBENCH_REQUIRE(lora_dropout >= 0 && lora_dropout < 1, ConfigError, "--lora-dropout {}: expected [0, 1)",
                  lora_dropout);
  MGBENCH_REQUIRE(!lora_targets.empty(), ConfigError, "--lora-targets: expected at least one target");
  MGBENCH_REQUIRE(device == "auto" || device == "cuda" || device == "cpu", ConfigError,
                  "--device '{}': expected auto, cuda or cpu", device);
  MGBENCH_REQUIRE(backend == "auto" || backend == "nccl" || backend == "mpi", ConfigError,
                  "--backend '{}': expected auto, nccl or mpi", backend);
  MGBENCH_REQUIRE(precision == "bf16" || precision == "fp32", ConfigError, "--precision '{}': expected bf16 or fp32",
                  precision);
  MGBENCH_REQUIRE(comm_timeout_s > 0, ConfigError, "--comm-timeout {}: expected > 0 s", comm_timeout_s);
  MGBENCH_REQUIRE(peak_tflops >= 0, ConfigError, "--peak-tflops {}: expected >= 0", peak_tflops);
  MGBENCH_REQUIRE(adapter.empty() || eval_only, ConfigError, "--adapter: only with --eval-only");
  MGBENCH_REQUIRE(!results.empty(), ConfigError, "--results: expected a file path");
  MGBENCH_REQUIRE(progress_interval_s > 0, ConfigError, "--progress-interval {}: expected > 0 s", progress_interval_s);
}

}  // namespace mgbench::train
