#pragma once
// The Llama 3 model with LoRA adapters that the LLM recipes share (lora_recipe.cpp, dpo_recipe.cpp):
// its options, the tokenizer, the model built in the run's dtype, loaded and adapted, batches of
// token sequences, the log-probabilities of their target tokens, FLOPs, and the adapters' export in
// PEFT's format. TorchTune's llama3 LoRA builders and recipes' model set-up.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "core/option_table.h"
#include "data/loader.h"
#include "data/text/llama3_tokenizer.h"
#include "data/text/sft.h"
#include "models/llama.h"
#include "results/hdf5.h"
#include "train/recipe.h"
#include "train/train_options.h"

namespace mgbench::train {

/// Sequences as one batch: tokens int64 [R, T] right-padded with pad_id to the longest; the flat
/// positions in the [R, T - 1] next-token grid whose next label is not masked, int64 [N]; those
/// labels, int64 [N]. samples = R; tokens: real tokens; padded_tokens = R x T; loss_targets = N.
/// As TorchTune's padded_collate_sft / padded_collate_dpo, with the targets found here (on the
/// loader thread) instead of in the loss.
data::Batch collate_sequences(const std::vector<const text::TokenizedSample*>& sequences, std::int64_t pad_id,
                              bool pin_memory);

/// Per sequence of a collated batch, the sum of its targets' log-probabilities (log_probs: [N], one
/// per target position): float32 [R], differentiable. TorchTune's get_batch_log_probs.
torch::Tensor sequence_log_probs(const data::Batch& batch, const torch::Tensor& log_probs);

class LlamaLora {
 public:
  /// Declares the model's options (section "Model": --model, --init, --tokenizer,
  /// --activation-checkpointing) and the adapters' (section "LoRA": --lora-rank, --lora-alpha,
  /// --lora-dropout, --lora-targets, --output-dir).
  void declare(options::OptionTable& table);
  /// Throws ConfigError naming the option: a precision other than bf16 / fp32 (the whole model in
  /// that dtype, as TorchTune), a single-process strategy, no or an unknown LoRA target. recipe:
  /// the recipe's name, for the messages.
  void validate(const TrainOptions& train, std::string_view recipe) const;

  /// Reads the model's configuration (config.json or a preset) and the tokenizer (--tokenizer, or
  /// the checkpoint's original/tokenizer.model or tokenizer.model). Throws ConfigError (a preset
  /// without --init random, no tokenizer) or DataError naming the file.
  void load_tokenizer();
  const text::Llama3Tokenizer& tokenizer() const { return *tokenizer_; }
  /// Builds the model on ctx.device in the precision's dtype (random, or the checkpoint's
  /// weights), freezes it and adds the adapters. Throws DataError naming the file (a checkpoint
  /// that does not fit, a tokenizer larger than the model's vocabulary).
  void build(const RecipeContext& ctx);

  models::LlamaForCausalLMImpl& model() { return *model_; }
  const models::LlamaForCausalLMImpl& model() const { return *model_; }
  /// The adapters, in registration order.
  const std::vector<torch::Tensor>& trainable() const { return trainable_; }
  /// The adapters by name (the frozen base is rebuilt from --model and --seed on a resume).
  std::vector<std::pair<std::string, torch::Tensor>> checkpoint_tensors() const;

  /// collate_sequences with the tokenizer's <|finetune_right_pad_id|>.
  data::Batch collate(const std::vector<const text::TokenizedSample*>& sequences, bool pin_memory) const;

  struct TargetLogProbs {
    torch::Tensor log_probs;  // float32 [N]: log p(target | prefix) at the batch's target positions
    torch::Tensor hidden;     // [R, T, H]: the final hidden states (for statistics of the logits)
  };
  /// A forward over the batch's tokens (on the device) and the log-probabilities of its targets
  /// (models::target_log_probs: only target positions reach the output projection).
  TargetLogProbs target_log_probs(const data::Batch& batch);

  /// Model FLOPs of a forward and backward over padded_tokens positions of sequences of length
  /// seq_len: 4 x (matmul parameters: all but the embedding table and the norms; a tied output
  /// counts) per token -- forward, and backward to the activations through the frozen weights;
  /// LoRA's own terms are negligible -- plus causal attention, 6 x layers x heads x head_dim x
  /// seq_len per token (docs/design.md).
  double flops(std::int64_t padded_tokens, std::int64_t seq_len) const;

  h5::Attributes attributes() const;
  /// Writes the adapters to --output-dir in PEFT's format (adapter_model.safetensors,
  /// adapter_config.json; fsynced) when one is given; call on one rank. Throws DataError naming
  /// the file on I/O errors.
  void save_adapters() const;

 private:
  enum class Init { kCheckpoint, kRandom };
  std::string model_name_ = "llama3-8b";  // preset name or a directory with config.json + safetensors
  Init init_ = Init::kCheckpoint;
  std::string tokenizer_path_;  // tiktoken file; default: the checkpoint's
  bool activation_checkpointing_ = false;
  models::LoraOptions lora_{8, 16.0, 0.0, {"q_proj", "v_proj", "output_proj", "mlp"}};  // TorchTune's llama3 8B
  std::string output_dir_;  // adapters written here at the end (PEFT format); "" = none

  std::optional<models::LlamaConfig> config_;
  std::unique_ptr<text::Llama3Tokenizer> tokenizer_;
  models::LlamaForCausalLM model_{nullptr};
  std::vector<torch::Tensor> trainable_;
};

}  // namespace mgbench::train
