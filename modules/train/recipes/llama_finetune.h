#pragma once
// The Llama 3 model the LLM recipes fine-tune (recipes/sft.cpp, recipes/dpo.cpp): its options, the
// tokenizer, the model built in the run's dtype, loaded, and what is trained -- LoRA adapters over
// a frozen base (dense, or NF4: QLoRA) or every parameter (full fine-tuning) -- optionally with
// 8da4w fake quantisation (QAT); the log-probabilities of a batch's target tokens, FLOPs, and the
// result's export (adapters in PEFT's format, or a Hugging Face checkpoint). TorchTune's llama3
// builders (lora_llama3_8b, qlora_llama3_8b, llama3_8b) and its recipes' model set-up
// (lora_finetune_distributed, full_finetune_distributed, qat_distributed,
// qat_lora_finetune_distributed). By concern: llama_finetune.cpp (options, tokenizer, the model
// built and loaded, log-probs, FLOPs), llama_memory.cpp (the memory plan and the checks against the
// device's memory), llama_export.cpp (adapters in and out, the exports); the batches are
// llama_batches.h's, the recipes' shared base llama_recipe.h's.
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
#include "train/parallel/shard_layout.h"
#include "train/recipe.h"
#include "train/recipes/llama_batches.h"
#include "train/train_options.h"

namespace mgbench::train {

/// What a fine-tuning run trains.
enum class Finetune {
  kLora,  // LoRA adapters; the base frozen (TorchTune's lora / qlora / qat_lora recipes)
  kFull,  // every parameter (TorchTune's full_finetune / qat recipes)
};
/// Fake quantisation while training (QAT).
enum class FakeQuant {
  kNone,
  k8da4w,  // int8 dynamic per-token activations, int4 per-group weights (models/fake_quant.h)
};

/// A micro-batch's shape for the memory plan: sequences [B] of up to `tokens` tokens [T] each.
struct MicroBatchShape {
  std::int64_t sequences = 1;
  std::int64_t tokens = 0;  // 0: unbounded
};

class UnitSharder;

/// The Llama model of a run in the default dtype on `device`, built one unit at a time (models::
/// LlamaForCausalLMImpl's constructor): its weights drawn as transformers initialises them, or, with
/// `checkpoint` (a Hugging Face checkpoint directory; empty: none), read from it with nothing drawn
/// (so the generator's state after it is not the random build's). sharder: a fully sharded run's
/// (nullptr: replicated, every tensor read whole, one at a time) -- each unit is cut to this rank's
/// shard as soon as it is built, its dense tensors read for this rank's rows only, its NF4
/// projections read whole one at a time and quantised before the cut: the rank holds its shards and
/// one unit, never the model, and its shards equal the rows FSDP would cut from the model built
/// whole (the same draws, the same file). Throws ConfigError / DataError as the constructor,
/// LlamaCheckpointReader and UnitSharder do.
models::LlamaForCausalLM build_llama(const models::LlamaConfig& config, models::BaseWeights base, torch::Device device,
                                     const std::string& checkpoint, UnitSharder* sharder);

class LlamaFinetune {
 public:
  /// Declares the model's options (section "Model": --model, --init, --tokenizer,
  /// --activation-checkpointing, --quantize-base, --finetune, --output-dir), the adapters' (section
  /// "LoRA": --lora-rank, --lora-alpha, --lora-dropout, --lora-targets) and QAT's (section "QAT":
  /// --fake-quant, --qat-group-size, --fake-quant-after-steps).
  void declare(options::OptionTable& table);
  /// Throws ConfigError naming the option: a precision other than bf16 / fp32 (the whole model in
  /// that dtype, as TorchTune), a single-process strategy, no or an unknown LoRA target, NF4 with
  /// full fine-tuning or with fake quantisation, --fake-quant-after-steps without --fake-quant, or
  /// (needs_adapters) full fine-tuning for a recipe whose reference is the model without its
  /// adapters. recipe: the recipe's name, for the messages.
  void validate(const TrainOptions& train, std::string_view recipe, bool needs_adapters = false) const;

  /// Reads the model's configuration (config.json or a preset) and the tokenizer (--tokenizer, or
  /// the checkpoint's original/tokenizer.model or tokenizer.model). Throws ConfigError (a preset
  /// without --init random, no tokenizer) or DataError naming the file.
  void load_tokenizer();
  /// After load_tokenizer: "" or why the tokenizer's special tokens may not be the checkpoint's
  /// (a tokenizer of fewer ranks than Meta's 128,000, whose specials follow its last rank, against a
  /// checkpoint of another vocabulary size: a tokenizer.model cut short, or a benchmark's random
  /// weights shaped like Llama 3 with a small test tokenizer). For rank 0 to warn of.
  std::string special_tokens_warning() const;
  const text::Llama3Tokenizer& tokenizer() const { return *tokenizer_; }
  /// The model's context, max_position_embeddings [tokens] (after load_tokenizer).
  std::int64_t context_length() const { return config_->max_position_embeddings; }
  /// What a rank holds of the model at each of world_sizes ranks (TrainOptions' sharding, precision and
  /// optimizer; FSDP's arithmetic, train/parallel/fsdp.h's sharded_memory), for `--dry-run`: what runs of
  /// those sizes record as their memory attributes. NF4 projections (QLoRA) are not parameters and
  /// not counted (weight_bytes). Reads only config.json or the preset. Throws ConfigError (an
  /// unknown preset) or DataError naming config.json. `micro_batch`: the sequences of a micro-batch
  /// and their tokens (0: unbounded, activations not estimated), for activation_bytes.
  std::vector<MemoryPlanRow> memory_plan(const TrainOptions& train, const std::vector<int>& world_sizes,
                                         const MicroBatchShape& micro_batch) const;
  /// The model's step as `mgbench predict --model` prices it (Recipe::model_step_shape): flops_of at
  /// one position attending `attended_per_position`, the trained parameters and FSDP's collectives of
  /// unit_shapes at the parameters' dtype. Reads only config.json or the preset; throws as memory_plan.
  ModelStepShape model_step_shape(const TrainOptions& train, double attended_per_position) const;
  /// What autograd keeps for one micro-batch [bytes], estimated from the shapes (not measured): per
  /// decoder layer and token 4h + 2q + 2kv + 4f elements of the compute dtype (each RMSNorm's input
  /// and output, q / k / v after RoPE, the attention's output, gate, up, SiLU(gate) and their product;
  /// h hidden, q / kv the heads' widths, f intermediate), for every layer without activation
  /// checkpointing, else each layer's input [B, T, h] plus one layer's set recomputed in backward;
  /// plus the head's chunk of fp32 logits and softmax (models/log_probs.h: at most 2^26 elements
  /// each) and the final hidden states [B, T, h]. -1 when the tokens are unbounded (--max-seq-len 0).
  std::int64_t activation_bytes(const MicroBatchShape& micro_batch, std::int64_t element_bytes) const;
  /// Builds the model on ctx.device in the precision's dtype (random, or the checkpoint's weights;
  /// NF4 projections quantised one at a time on the device), adds the adapters or unfreezes
  /// everything, and turns on fake quantisation. Throws DataError naming the file (a checkpoint
  /// that does not fit, a tokenizer larger than the model's vocabulary) or ConfigError (a shape NF4
  /// or the QAT group size cannot take, naming the layer).
  void build(const RecipeContext& ctx);

  /// Loads a PEFT LoRA adapter (--adapter DIR: adapter_model.safetensors) into the built model,
  /// after checking DIR/adapter_config.json against this run's adapters: r, lora_alpha and
  /// target_modules must equal --lora-rank, --lora-alpha and --lora-targets (an adapter trained with
  /// alpha 64 and evaluated with 16 scales its update by a quarter: a wrong loss, no error). Throws
  /// ConfigError naming the file, each differing value and the options to give, or DataError for a
  /// missing or malformed file.
  void load_adapter(const std::string& dir);

  models::LlamaForCausalLMImpl& model() { return *model_; }
  const models::LlamaForCausalLMImpl& model() const { return *model_; }
  /// What the optimizer trains, in registration order: the adapters, or every parameter.
  const std::vector<torch::Tensor>& trainable() const { return trainable_; }
  /// The trained tensors by name (a frozen base is rebuilt from --model and --seed on a resume).
  std::vector<std::pair<std::string, torch::Tensor>> checkpoint_tensors() const;
  /// --activation-checkpointing: each decoder layer recomputed in backward (applied by the loop's
  /// parallel plan, train/parallel/parallelize.h).
  bool activation_checkpointing() const { return activation_checkpointing_; }
  /// Before optimizer step `global_step` (0-based, on a resume too): fake quantisation is off for
  /// the first --fake-quant-after-steps steps (TorchTune's fake_quant_after_n_steps). Returns true
  /// when this call switched it (Recipe::begin_step: forward changed).
  bool begin_step(std::int64_t global_step);
  /// Recipe::steps_warning: --fake-quant-after-steps at or past the run's optimizer steps.
  std::string steps_warning(std::int64_t optimizer_steps) const;

  struct TargetLogProbs {
    torch::Tensor log_probs;  // float32 [N]: log p(target | prefix) at the batch's target positions
    torch::Tensor hidden;     // [R, T, H]: the final hidden states (for statistics of the logits)
  };
  /// A forward over the batch's tokens (on the device) and the log-probabilities of its targets
  /// (models::target_log_probs: only target positions reach the output projection).
  TargetLogProbs target_log_probs(const data::Batch& batch);
  /// Why this model's micro-batches cannot be captured as CUDA graphs (Recipe::graph_blocker), or "":
  /// LoRA dropout under activation checkpointing (the recomputation replays the generator's state,
  /// which a capture cannot read). QAT's late switch does not block: begin_step says when it
  /// changes forward, and the loop captures again.
  std::string graph_blocker() const;

  /// Model FLOPs of a forward and backward over a collated batch's computed positions (R x T padded,
  /// or the S packed tokens): the matmul parameters (all but the embedding table and the norms; a
  /// tied output counts) times 4 per position with LoRA -- forward, and backward to the activations
  /// through the frozen weights; LoRA's own terms are negligible -- or 6 with full fine-tuning (the
  /// weight gradients too), plus attention, 6 x layers x heads x head_dim x the length of the
  /// position's sequence (padded: T; packed: its own) (docs/design.md). Dequantisation and fake
  /// quantisation are not model FLOPs.
  double flops(const data::Batch& batch) const;

  /// model_parameters, weight_bytes (as held: NF4 or dense, adapters included) and
  /// weight_bytes_per_parameter, and the fake-quantised linears' count.
  h5::Attributes attributes() const;
  /// What was trained, for --output-dir when one is given (none otherwise): the adapters in PEFT's
  /// format (adapter_model.safetensors), or with full fine-tuning a Hugging Face checkpoint
  /// (model.safetensors), as Recipe::tensor_exports.
  std::vector<TensorExport> exports() const;
  /// The configuration files beside exports() (fsynced; call on one rank): adapter_config.json, or
  /// config.json; with fake quantisation also qat_config.json ({"scheme": "8da4w", "group_size":
  /// G, "linears": [...]}, what `mgbench quantize` converts). Throws DataError naming the file on
  /// I/O errors.
  void save() const;
  /// --output-dir made (if missing) at set-up and checked writable: throws ConfigError naming it
  /// otherwise -- found only when the run ended, the trained adapters or model were lost with it --,
  /// and where it is the --model directory (its checkpoint would be overwritten).
  void prepare_output_dir() const;

 private:
  enum class Init { kCheckpoint, kRandom };
  /// config.json of the --model directory, or the preset.
  models::LlamaConfig read_config() const;
  /// flops()'s arithmetic on config c: `positions` computed, `attended` the sum over them of their
  /// sequence's length.
  double flops_of(const models::LlamaConfig& c, double positions, double attended) const;
  /// The model's FSDP units as parameter shapes (models::LlamaForCausalLMImpl::parameter_units'
  /// order and rules), with the LoRA adapters this run adds; NF4 projections as packed bytes
  /// (element_bytes: the parameters' dtype, that of the NF4 factors).
  std::vector<UnitShape> unit_shapes(const models::LlamaConfig& c, std::int64_t element_bytes) const;
  /// Throws DataError naming config.json, its sizes and the memory, when the weights alone (under a
  /// sharded build, this rank's shard of them) exceed the device's memory, before anything is
  /// allocated.
  void refuse_if_weights_do_not_fit(const RecipeContext& ctx) const;
  /// On a GPU: throws ConfigError naming the bytes per rank (parameters, gradients, optimizer states:
  /// the memory plan at this world size) and the rank count that would fit under fsdp, when they
  /// exceed the device's memory (a replica of Llama 3 8B's full fine-tuning on 80 GB), before anything
  /// is allocated.
  void refuse_if_plan_does_not_fit(const RecipeContext& ctx) const;
  std::string model_name_ = "llama3-8b";  // preset name or a directory with config.json + safetensors
  Init init_ = Init::kCheckpoint;
  std::string tokenizer_path_;  // tiktoken file; default: the checkpoint's
  std::string tokenizer_file_;  // the file load_tokenizer read (--tokenizer or the checkpoint's)
  bool activation_checkpointing_ = false;
  models::BaseWeights base_ = models::BaseWeights::kDense;
  Finetune finetune_ = Finetune::kLora;
  models::LoraOptions lora_{8, 16.0, 0.0, {"q_proj", "v_proj", "output_proj", "mlp"}};  // TorchTune's llama3 8B
  FakeQuant fake_quant_ = FakeQuant::kNone;
  std::int64_t qat_group_size_ = 256;  // TorchTune's Int8DynActInt4WeightQATQuantizer(groupsize=256)
  std::int64_t fake_quant_after_steps_ = 0;
  std::optional<bool> fake_quant_on_;  // as the last begin_step set it (none before the first)
  std::string output_dir_;             // what was trained written here at the end; "" = nowhere

  std::optional<models::LlamaConfig> config_;
  std::unique_ptr<text::Llama3Tokenizer> tokenizer_;
  models::LlamaForCausalLM model_{nullptr};
  std::vector<torch::Tensor> trainable_;
  std::vector<std::string> fake_quantized_;  // names of the fake-quantised linears
};

}  // namespace mgbench::train
