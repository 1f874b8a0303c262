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

/// A bias-free linear layer (parameter "weight" [out, in], as nn::Linear) that can carry a LoRA
/// adapter (children "lora_A", "lora_B", PEFT's names).
class LoraLinearImpl : public torch::nn::Module {
 public:
  LoraLinearImpl(std::int64_t in_features, std::int64_t out_features);
  /// x: [..., in] -> [..., out].
  torch::Tensor forward(const torch::Tensor& x);
  /// Adds the adapter (A Kaiming-uniform as nn::Linear's default, B zeros) in weight's dtype and
  /// device, and freezes weight.
  void enable_lora(std::int64_t rank, double alpha, double dropout);
  bool has_lora() const { return !lora_a.is_empty(); }
  /// false: forward is the base layer's alone (the adapter is kept, untouched): AdaptersDisabled.
  bool adapter_enabled = true;

  torch::Tensor weight;
  torch::nn::Linear lora_a{nullptr}, lora_b{nullptr};  // registered as "lora_A", "lora_B"
  torch::nn::Dropout dropout{nullptr};
  double scaling = 0;  // alpha / rank
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
  explicit LlamaAttentionImpl(const LlamaConfig& c);
  /// x: [B, T, hidden]; cos, sin: [T, head_dim] (x's dtype). Causal self-attention. Returns [B, T, hidden].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  LoraLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  std::int64_t heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(LlamaAttention);

class LlamaMLPImpl : public torch::nn::Module {
 public:
  explicit LlamaMLPImpl(const LlamaConfig& c);
  /// down(silu(gate(x)) * up(x))
  torch::Tensor forward(const torch::Tensor& x);
  LoraLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  explicit LlamaDecoderLayerImpl(const LlamaConfig& c);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  LlamaRMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

/// transformers' LlamaModel (the "model." prefix).
class LlamaBodyImpl : public torch::nn::Module {
 public:
  explicit LlamaBodyImpl(const LlamaConfig& c);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  LlamaRMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaBody);

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  /// Random initialisation as transformers' (normal(0, 0.02) for linear and embedding weights,
  /// ones for norms). Throws ConfigError for an invalid config.
  explicit LlamaForCausalLMImpl(const LlamaConfig& config);

  /// tokens: int64 [B, T]. Returns logits [B, T, vocab_size] in the parameters' dtype.
  torch::Tensor forward(const torch::Tensor& tokens);
  /// Hidden states after the final norm, [B, T, hidden] (for a chunked loss without full logits).
  torch::Tensor hidden_states(const torch::Tensor& tokens);
  /// The output projection's weight [vocab, hidden] (the embedding when tied).
  torch::Tensor output_weight() const;

  /// Loads a Hugging Face checkpoint directory (safetensors, single or sharded) by name, converting
  /// dtypes to the model's. Throws DataError naming the file and tensor for a missing tensor, a
  /// shape mismatch or an unexpected extra tensor (rotary inv_freq buffers are ignored).
  void load_hf_checkpoint(const std::string& dir);

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

 private:
  bool checkpointing_ = false;
  /// cos, sin [T, head_dim] in dtype on device (computed in fp32 from the cached inverse frequencies).
  std::pair<torch::Tensor, torch::Tensor> rotary(std::int64_t length, torch::Dtype dtype, torch::Device device);

  LlamaConfig config_;
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
