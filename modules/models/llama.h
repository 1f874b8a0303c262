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
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "models/nf4.h"

namespace mgbench::models {

struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 8192;
};

struct LlamaConfig {
  std::int64_t vocab_size = 128256;
  std::int64_t hidden_size = 4096;
  std::int64_t intermediate_size = 14336;
  std::int64_t num_hidden_layers = 32;
  std::int64_t num_attention_heads = 32;
  std::int64_t num_key_value_heads = 8;
  std::int64_t head_dim = 128;  // hidden_size / num_attention_heads unless config.json says otherwise
  double rms_norm_eps = 1e-5;
  double rope_theta = 500000.0;
  std::optional<Llama3RopeScaling> rope_scaling;  // rope_type "llama3"; none: plain RoPE
  std::int64_t max_position_embeddings = 8192;
  bool tie_word_embeddings = false;

  /// Reads a Hugging Face config.json (model_type "llama"). Throws DataError naming the file and
  /// the field for a missing file, invalid JSON, a missing required field, a rope_scaling other
  /// than llama3 / none, or inconsistent sizes (heads not dividing, ...).
  static LlamaConfig from_hf_json(const std::string& path);
  /// config.json text as transformers writes a LlamaConfig (model_type llama, rope_scaling
  /// llama3 or none), weights stored in dtype; from_hf_json reads it back equal.
  std::string to_hf_json(torch::ScalarType dtype) const;
  /// Presets: "llama3-8b" (Meta-Llama-3-8B), "llama3.1-8b" (with llama3 rope scaling),
  /// "llama3.2-1b" (tied embeddings), "tiny" (2 layers, 64 hidden, for tests and CPU demos).
  /// Throws ConfigError listing the presets for an unknown name.
  static LlamaConfig preset(const std::string& name);
  /// Throws ConfigError for inconsistent sizes.
  void validate() const;
  /// Parameters of the model (embedding and output counted once when tied).
  std::int64_t num_parameters() const;
};

/// LoRA settings (Hu et al. 2021; TorchTune's llama3 LoRA recipes): out = W x + (alpha / rank) *
/// B A dropout(x), A [rank, in] Kaiming-uniform, B [out, rank] zero, W frozen.
struct LoraOptions {
  std::int64_t rank = 8;
  double alpha = 16.0;
  double dropout = 0.0;
  /// Projections that get adapters, by HF name (q_proj, k_proj, v_proj, o_proj, gate_proj,
  /// up_proj, down_proj); TorchTune's names are accepted too (output_proj = o_proj, mlp = the three
  /// MLP projections). TorchTune's llama3 8B default: q_proj, v_proj, output_proj, mlp.
  std::vector<std::string> targets{"q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  /// Expands TorchTune names to HF names; throws ConfigError naming an unknown target.
  std::vector<std::string> hf_targets() const;
};

/// How the decoder layers' projections hold their frozen base weights.
enum class BaseWeights {
  kDense,  // a parameter in the model's dtype
  kNf4,    // NF4 (models/nf4.h): QLoRA's base, TorchTune's quantize_base=True
};

/// A bias-free linear layer that can carry a LoRA adapter (children "lora_A", "lora_B", PEFT's
/// names), hold its base weight in NF4, and fake-quantise its input and weight (8da4w QAT,
/// models/fake_quant.h). TorchTune's LoRALinear, FrozenNF4Linear and QATLoRALinear, and torchao's
/// Int8DynActInt4WeightQATLinear, as one layer:
///   y = base(x) + (alpha / rank) B A dropout(x)   (the adapter's term while enabled),
///   base(x) = linear_nf4(x, W)                    (NF4),
///           = linear(fq_a(x), fq_w(W))            (fake quantisation on),
///           = linear(x, W)                        (otherwise).
class LoraLinearImpl : public torch::nn::Module {
 public:
  /// kDense: parameter "weight" [out, in] in the default dtype, uninitialised (the model
  /// initialises it); kNf4: no weight parameter until quantize_base() gives the NF4 weight.
  LoraLinearImpl(std::int64_t in_features, std::int64_t out_features, BaseWeights base = BaseWeights::kDense);
  /// x: [..., in] -> [..., out].
  torch::Tensor forward(const torch::Tensor& x);
  /// Adds the adapter (A Kaiming-uniform as nn::Linear's default, B zeros) in the base weight's
  /// dtype and device, and freezes the base weight.
  void enable_lora(std::int64_t rank, double alpha, double dropout);
  bool has_lora() const { return !lora_a.is_empty(); }
  /// false: forward is the base layer's alone (the adapter is kept, untouched): AdaptersDisabled.
  bool adapter_enabled = true;

  /// The NF4 base weight from dense [out, in] (quantised on dense's device). Throws
  /// std::logic_error for a kDense layer, std::invalid_argument for a weight of another shape or a
  /// numel NF4 cannot take (models/nf4.h).
  void quantize_base(const torch::Tensor& dense);
  bool is_nf4() const { return base_ == BaseWeights::kNf4; }

  /// Fake-quantises input and weight from now on (8da4w, groups of group_size in-features).
  /// Throws std::invalid_argument for an NF4 layer or in_features % group_size != 0.
  void enable_fake_quant(std::int64_t group_size);
  bool has_fake_quant() const { return fake_quant_group_ > 0; }
  /// false: the fake-quantised layer computes as a plain one (--fake-quant-after-steps).
  bool fake_quant_enabled = true;
  /// The input and weight of the base product: fq_a(x), fq_w(W) when fake quantisation is on,
  /// x, W otherwise (for a chunked output projection). Throws std::logic_error for an NF4 layer.
  torch::Tensor base_input(const torch::Tensor& x) const;
  torch::Tensor base_weight() const;

  /// W += (alpha / rank) B A in W's dtype, then the adapter removed from the forward (TorchTune's
  /// get_merged_lora_ckpt). Throws std::logic_error without an adapter or for an NF4 base.
  void merge_lora();

  /// Bytes of the base weight (dense or NF4) -- the adapter's not included.
  std::int64_t base_nbytes() const;

  /// The module's moves also move the NF4 tensors (to their device only: they keep their dtypes).
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  const std::int64_t in_features, out_features;
  torch::Tensor weight;                                // [out, in]; undefined for an NF4 layer
  Nf4Weight nf4;                                       // the NF4 base weight (an NF4 layer)
  torch::nn::Linear lora_a{nullptr}, lora_b{nullptr};  // registered as "lora_A", "lora_B"
  torch::nn::Dropout dropout{nullptr};
  double scaling = 0;  // alpha / rank

 private:
  bool fake_quant_active() const { return fake_quant_group_ > 0 && fake_quant_enabled; }
  BaseWeights base_;
  torch::ScalarType dtype_;  // of the base weight
  std::int64_t fake_quant_group_ = 0;
};
TORCH_MODULE(LoraLinear);

/// Llama's RMSNorm: x * rsqrt(mean(x^2) + eps) computed in fp32, times weight, in x's dtype.
class LlamaRMSNormImpl : public torch::nn::Module {
 public:
  LlamaRMSNormImpl(std::int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(LlamaRMSNorm);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const LlamaConfig& c, BaseWeights base);
  /// x: [B, T, hidden]; cos, sin: [T, head_dim] (x's dtype). Causal self-attention. Returns [B, T, hidden].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
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
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  LlamaRMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

/// transformers' LlamaModel (the "model." prefix).
class LlamaBodyImpl : public torch::nn::Module {
 public:
  LlamaBodyImpl(const LlamaConfig& c, BaseWeights base);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  LlamaRMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaBody);

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  /// Random initialisation as transformers' (normal(0, 0.02) for linear and embedding weights,
  /// drawn in registration order; ones for norms), in the default dtype on the CPU. base: how the
  /// decoder layers' seven projections hold their weights; NF4 ones are quantised one at a time as
  /// they are initialised (here) or loaded (load_hf_checkpoint), on quantize_device, so that the
  /// whole model never exists in the dense dtype -- embeddings, norms and the output head stay
  /// dense, as TorchTune's qlora_llama3_8b. Throws ConfigError for an invalid config, or naming
  /// the projection whose numel NF4 cannot take.
  explicit LlamaForCausalLMImpl(const LlamaConfig& config, BaseWeights base = BaseWeights::kDense,
                                torch::Device quantize_device = torch::kCPU);

  /// tokens: int64 [B, T]. Returns logits [B, T, vocab_size] in the parameters' dtype.
  torch::Tensor forward(const torch::Tensor& tokens);
  /// Hidden states after the final norm, [B, T, hidden] (for a chunked loss without full logits).
  torch::Tensor hidden_states(const torch::Tensor& tokens);
  /// The output projection's weight [vocab, hidden] (the embedding when tied).
  torch::Tensor output_weight() const;
  /// The output projection's input and weight as it computes them: (hidden [N, hidden],
  /// output_weight()), or both fake-quantised when the head is (full QAT of an untied head).
  std::pair<torch::Tensor, torch::Tensor> output_projection(const torch::Tensor& hidden) const;

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
  /// training mode with grad enabled; the gradients are unchanged (LoRA dropout replays its RNG).
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }

  const LlamaConfig& config() const { return config_; }
  BaseWeights base_weights() const { return base_; }

 private:
  bool checkpointing_ = false;
  /// cos, sin [T, head_dim] in dtype on device (computed in fp32 from the cached inverse frequencies).
  std::pair<torch::Tensor, torch::Tensor> rotary(std::int64_t length, torch::Dtype dtype, torch::Device device);

  LlamaConfig config_;
  BaseWeights base_;
  torch::Device quantize_device_;
  LlamaBody model{nullptr};
  LoraLinear lm_head{nullptr};  // absent when tied
  torch::Tensor inv_freq_;      // [head_dim / 2] fp32, not a parameter or buffer
};
TORCH_MODULE(LlamaForCausalLM);

/// The model without its LoRA adapters while alive -- its base, as TorchTune's disable_adapter
/// context manager and peft's disable_adapter() give it (DPO's reference model); enabled again on
/// destruction. One set of base weights serves both.
class AdaptersDisabled {
 public:
  explicit AdaptersDisabled(torch::nn::Module& model);
  ~AdaptersDisabled();
  AdaptersDisabled(const AdaptersDisabled&) = delete;
  AdaptersDisabled& operator=(const AdaptersDisabled&) = delete;

 private:
  std::vector<LoraLinearImpl*> layers_;
};

/// Rotary inverse frequencies [head_dim / 2] (fp64 maths, fp32 result) with Llama 3's scaling
/// when given (transformers' _compute_llama3_parameters).
torch::Tensor llama_inv_freq(const LlamaConfig& c);

}  // namespace mgbench::models
