#pragma once
// The LLM job (Lawenda et al. 2025, sec. 4): LoRA fine-tuning of a Llama 3 model with TorchTune's
// lora_finetune recipe semantics, across MPI ranks:
//  - samples: the dataset's rows through TorchTune's templates and masks (data/text/sft.h),
//    sharded by DistributedSampler (ddp-ds), padded per micro-batch (tokens with
//    <|finetune_right_pad_id|>, labels with -100);
//  - loss: cross-entropy of the next token, summed over label tokens; the gradient of an optimizer
//    step (grad_accum micro-batches on every rank) is divided by the step's label tokens over all
//    ranks, so N ranks x batch b equals 1 rank x batch N*b (TorchTune 0.6's token normalisation);
//  - LoRA adapters trained by AdamW (weight decay 0.01), cosine schedule with linear warm-up,
//    optional gradient clipping; adapter gradients averaged over the Communicator (GradSync on the
//    last micro-batch of a step, as DDP's no_sync);
//  - per step: phase times, tokens (real and padded), loss, lr; summary: s/it, tokens/s, MFU.
// --eval-only: the token-weighted mean cross-entropy of the dataset ("eval loss: <value>").
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
#include "train/llm_config.h"

namespace mgbench::train {

class LlmTuner {
 public:
  /// Throws ConfigError for an invalid config.
  LlmTuner(LlmConfig config, runtime::Communicator& comm, runtime::DevicePlacement placement);
  ~LlmTuner();

  /// Tokenizer, dataset (tokenised), model (checkpoint or random), LoRA, optimizer. Collective-free.
  /// Throws DataError naming the file for unusable inputs, ConfigError for inconsistent options.
  void load();

  results::RankLayout layout() const;
  h5::Attributes run_attributes() const;
  h5::Attributes rank_attributes() const;

  /// Fine-tunes; writes steps, epochs and (rank 0) the summary. control (optional): resume,
  /// checkpoints (the trained tensors, i.e. the adapters, with optimizer, RNG and position; the
  /// frozen base comes from --model / --seed again) and the agreed stop, as ImageTrainer::run.
  results::RunSummary run(results::ResultsWriter& writer, Progress& progress, RunControl* control = nullptr);
  /// Token-weighted mean cross-entropy over the whole dataset (each rank a contiguous shard, sums
  /// reduced over ranks). Collective.
  double evaluate();
  /// Writes the adapters in PEFT's format (adapter_model.safetensors, adapter_config.json) to dir.
  /// Call on one rank. Throws DataError naming the file on I/O errors.
  void save_adapter(const std::string& dir) const;

  /// The trainable (LoRA) parameters, in registration order.
  std::vector<torch::Tensor> adapter_parameters() const;

  /// Model FLOPs of one optimizer step over `padded_tokens` positions of sequences of length
  /// `seq_len` (documented in docs/design.md): 4 x (matmul parameters) per token (forward, and
  /// backward to the activations through frozen weights; LoRA's own terms are negligible) plus
  /// causal attention 6 x layers x heads x head_dim x seq_len per token.
  double step_flops(double padded_tokens, double seq_len) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace mgbench::train
