#pragma once
// The Llama 3 family in LibTorch, with Hugging Face's module and parameter names
// (transformers' LlamaForCausalLM: model.embed_tokens, model.layers.N.{input_layernorm,
// self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm,
// lm_head), so HF safetensors checkpoints load by name. Grouped-query attention through
// scaled_dot_product_attention (flash / memory-efficient kernels on GPUs), rotary embeddings in
// HF's rotate-half layout with Llama 3's frequency scaling, RMSNorm in fp32, SwiGLU MLP, tied or
// untied output. Follows transformers/models/llama/modeling_llama.py and
// transformers/modeling_rope_utils.py (_compute_llama3_parameters).
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "models/attention.h"
#include "models/llama_config.h"
#include "models/lora.h"
#include "models/parameter_units.h"

namespace mgbench::models {

/// Sequences packed into one row without padding (--padding none): tokens [1, S] hold them one
/// after another; positions restart at 0 in each (rotary embeddings as for the sequence alone) and
/// attention stays within each (causal per sequence): every sequence's outputs equal those it has
/// alone, or right-padded in a batch.
struct SequencePacking {
  torch::Tensor position_ids;  // int64 [S] on the tokens' device: each token's position in its sequence
  PackedRuns runs;             // the sequences' lengths (summing to S) as attention takes them
};

/// Llama's RMSNorm: x * rsqrt(mean(x^2) + eps) computed in fp32, times weight, in x's dtype
/// (transformers' LlamaRMSNorm: the normalised value rounded to x's dtype, then times the weight).
/// On a GPU, weight and x of one dtype: at::rms_norm, one fused kernel forward and one backward
/// (torch's _fused_rms_norm), which multiplies by the weight in fp32 and rounds once -- equal in
/// fp32 up to summation order, within one rounding of a 16-bit dtype otherwise.
class LlamaRMSNormImpl : public torch::nn::Module {
 public:
  LlamaRMSNormImpl(std::int64_t dim, double eps);
  /// x [..., dim] -> weight * (x / rms(x)) as HF computes it: the statistics in fp32 (float64 for a
  /// float64 x), the normalised x cast back to x's dtype before the weight; [..., dim] in the
  /// promotion of x's and weight's dtypes. On a GPU, weight and x of one dtype: ATen's fused kernel (at::rms_norm);
  /// elsewhere one autograd node (llama.cpp's RmsNorm).
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
  torch::Tensor eps_tensor_;  // eps as [], fp32 on the CPU; made again for an input elsewhere or in float64
};
TORCH_MODULE(LlamaRMSNorm);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const LlamaConfig& c, BaseWeights base);
  /// x: [B, T, hidden]; cos, sin: [T, head_dim] (x's dtype), sin with its first half negated
  /// (rotary()'s: HF's rotate_half(x) * sin is x rolled by head_dim / 2 times it, one op where
  /// rotate_half takes four). Causal self-attention. Returns [B, T, hidden].
  /// runs (packed sequences, B = 1): causal attention within each run (causal_attention), cos and
  /// sin by each token's own position.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const PackedRuns* runs = nullptr);
  LoraLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  std::int64_t heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(LlamaAttention);

class LlamaMLPImpl : public torch::nn::Module {
 public:
  LlamaMLPImpl(const LlamaConfig& c, BaseWeights base);
  /// down(silu(gate(x)) * up(x))
  torch::Tensor forward(const torch::Tensor& x);
  LoraLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(const LlamaConfig& c, BaseWeights base);
  /// As LlamaAttentionImpl::forward's arguments.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const PackedRuns* runs = nullptr);
  LlamaRMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

/// transformers' LlamaModel (the "model." prefix).
class LlamaBodyImpl : public torch::nn::Module {
 public:
  /// Each part as it is built (embedding, each decoder layer, the norm) goes to place(name, part),
  /// its name under the "model." prefix: the caller moves and initialises it before the next part
  /// exists.
  using Place = std::function<void(const std::string& name, torch::nn::Module& part)>;
  LlamaBodyImpl(const LlamaConfig& c, BaseWeights base, const Place& place);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  LlamaRMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaBody);

class LlamaForCausalLMImpl : public torch::nn::Module, public ShardableModel {
 public:
  /// Random initialisation as transformers' (normal(0, 0.02) for linear and embedding weights,
  /// drawn in registration order; ones for norms), in the default dtype, on `device`: the model is
  /// built one unit at a time (embedding, each decoder layer, norm, head), each moved to the device
  /// and drawn there (the device's generator: on a GPU in parallel, and only one unit ever on the
  /// host, not the whole model: 8B in bf16 is 16 GB a rank). base: how the decoder layers' seven
  /// projections hold their weights; NF4 ones are quantised one at a time as they are initialised
  /// (here) or loaded (load_hf_checkpoint), so that the whole model never exists in the dense dtype
  /// -- embeddings, norms and the output head stay dense, as TorchTune's qlora_llama3_8b. Throws
  /// ConfigError for an invalid config, or naming the projection whose numel NF4 cannot take.
  /// placed: called with each part once it is on the device and drawn, before the next is built.
  /// draw false: the weights are left as allocated (uninitialised; NF4 projections not quantised)
  /// for a caller that loads every one of them (a checkpoint: LlamaCheckpointReader), which saves
  /// drawing the whole model only to overwrite it.
  explicit LlamaForCausalLMImpl(const LlamaConfig& config, BaseWeights base = BaseWeights::kDense,
                                torch::Device device = torch::kCPU, const LlamaBodyImpl::Place& placed = {},
                                bool draw = true);

  /// tokens: int64 [B, T]. Returns logits [B, T, vocab_size] in the parameters' dtype.
  torch::Tensor forward(const torch::Tensor& tokens);
  /// Hidden states after the final norm, [B, T, hidden] (for a chunked loss without full logits).
  /// packing: tokens [1, S] are sequences packed without padding (SequencePacking); throws
  /// std::invalid_argument when its lengths do not sum to S or its position_ids are not [S].
  torch::Tensor hidden_states(const torch::Tensor& tokens, const SequencePacking* packing = nullptr);
  /// The output projection's weight [vocab, hidden] (the embedding when tied); its unit is entered
  /// first, so that under FSDP it holds its values (a gather on every rank alike).
  torch::Tensor output_weight() const;
  /// The output projection as it computes: input [N, hidden] and weight [vocab, hidden]
  /// (output_weight()), or both fake-quantised when the head is (full QAT of an untied head); and
  /// where the weight's gradient goes: the unit hooks' row_gradient_sink for an untied head whose
  /// weight is the parameter itself and trains (FSDP's blocks), else nullptr (autograd, whole).
  struct OutputProjection {
    torch::Tensor input, weight;
    RowGradientSink* weight_gradient = nullptr;
  };
  OutputProjection output_projection(const torch::Tensor& hidden) const;

  /// Loads a Hugging Face checkpoint directory (safetensors, single or sharded) by name, converting
  /// dtypes to the model's; NF4 projections are quantised tensor by tensor. Throws DataError naming
  /// the file and tensor for a missing tensor, a shape mismatch or an unexpected extra tensor
  /// (rotary inv_freq buffers are ignored).
  void load_hf_checkpoint(const std::string& dir);
  /// The dense weights under Hugging Face's names (what load_hf_checkpoint reads; adapters
  /// excluded). Throws std::logic_error for a model with NF4 weights.
  std::vector<std::pair<std::string, torch::Tensor>> hf_state_dict() const;

  /// Fake quantisation (8da4w, groups of group_size) of the linears TorchTune's QAT recipes give
  /// it: lora_only false -- every linear whose in-features group_size divides, the untied output
  /// head included (torchao's Int8DynActInt4WeightQATQuantizer.prepare; a tied head is the
  /// embedding, not a linear); true -- the LoRA-wrapped ones (apply_lora first; qat-lora).
  /// Returns the names of the fake-quantised linears and, in `skipped`, the others torchao would
  /// leave (not divisible). Throws ConfigError naming the first LoRA-wrapped linear that the group
  /// does not divide (lora_only), or an NF4 model.
  std::vector<std::string> enable_fake_quant(std::int64_t group_size, bool lora_only,
                                             std::vector<std::string>* skipped = nullptr);
  /// Turns fake quantisation of every fake-quantised linear on or off.
  void set_fake_quant_enabled(bool on);
  /// Bytes of the base model's weights as held (dense parameters and NF4 weights; LoRA adapters,
  /// counted by trainable parameters, are not): config().num_parameters() weights.
  std::int64_t weight_nbytes() const;

  /// Adds LoRA adapters to the targeted projections of every layer and freezes every other
  /// parameter (embeddings, norms, output). Returns the trainable (adapter) parameters in
  /// registration order. Throws ConfigError for rank < 1, alpha <= 0, dropout outside [0, 1) or
  /// an unknown target.
  std::vector<torch::Tensor> apply_lora(const LoraOptions& options);
  /// The adapter tensors under PEFT's names ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").
  std::vector<std::pair<std::string, torch::Tensor>> lora_state_dict() const;
  /// Loads adapter tensors written by PEFT (adapter_model.safetensors) or lora_state_dict() into
  /// the adapters (apply_lora first). Throws DataError naming the file and tensor for a missing,
  /// extra or mis-shaped tensor.
  void load_lora_adapter(const std::string& safetensors_path);

  /// Activation checkpointing per decoder layer: forward keeps only each layer's input and
  /// recomputes the layer in backward (a custom autograd function: LibTorch has no
  /// torch.utils.checkpoint), trading one extra forward for the layers' activations. Used in
  /// training mode with grad enabled; the gradients are unchanged (LoRA dropout replays its RNG; without
  /// dropout the generator is left alone).
  void set_activation_checkpointing(bool on) override { checkpointing_ = on; }

  const LlamaConfig& config() const { return config_; }
  BaseWeights base_weights() const { return base_; }

  /// FSDP units as TorchTune's shard_model makes them for Llama 3 (custom_sharded_layers
  /// tok_embeddings and output): 0 the token embedding, 1..L the decoder layers, L + 1 the root
  /// (the final norm), L + 2 the output head when untied. A tied head is the embedding's unit,
  /// entered again before the output projection and kept gathered through backward; the root and
  /// the head are the last of forward and kept too. NF4 base weights are not parameters: each
  /// layer's are its unit's packed weights (ParameterUnit::packed).
  std::vector<ParameterUnit> parameter_units() override;
  void set_unit_hooks(UnitHooks* hooks) override { hooks_ = hooks; }
  /// The unit of a part as the constructor hands it to `placed` (its name there: "model.layers.3",
  /// "model.embed_tokens", "model.norm", "lm_head"): the part's parameters under HF's names and its
  /// NF4 weights packed, as parameter_units() lists them (the norm's unit is named "root" there).
  /// What a sharded build cuts unit by unit (train/parallel/unit_sharder.h).
  static ParameterUnit part_unit(const std::string& name, const torch::nn::Module& part,
                                 bool reshard_after_forward = true);

 private:
  bool checkpointing_ = false;
  double lora_dropout_ = 0;  // apply_lora's: > 0, a checkpointed layer replays the generator's state
  UnitHooks* hooks_ = nullptr;
  torch::Tensor enter(int unit, const torch::Tensor& x) const { return hooks_ ? hooks_->before_forward(unit, x) : x; }
  torch::Tensor leave(int unit, const torch::Tensor& x) const { return hooks_ ? hooks_->after_forward(unit, x) : x; }
  /// cos, sin [T, head_dim] in dtype on device (computed in fp32 from the cached inverse frequencies),
  /// for positions 0 .. length - 1, or for position_ids [T] where defined; sin's first half negated
  /// (LlamaAttentionImpl::forward).
  std::pair<torch::Tensor, torch::Tensor> rotary(std::int64_t length, torch::Dtype dtype, torch::Device device,
                                                 const torch::Tensor& position_ids = {});

  LlamaConfig config_;
  BaseWeights base_;
  /// Moves a just-built part to device_ and draws its weights there (NF4 projections quantised).
  void place(const std::string& name, torch::nn::Module& part, const LlamaBodyImpl::Place& placed, bool draw);

  torch::Device device_;
  LlamaBody model{nullptr};
  LoraLinear lm_head{nullptr};  // absent when tied
  torch::Tensor inv_freq_;      // [head_dim / 2] fp32, not a parameter or buffer
};
TORCH_MODULE(LlamaForCausalLM);

/// Rotary inverse frequencies [head_dim / 2] (fp64 maths, fp32 result) with Llama 3's scaling
/// when given (transformers' _compute_llama3_parameters).
torch::Tensor llama_inv_freq(const LlamaConfig& c);

}  // namespace mgbench::models
