#pragma once
// LoRA on a bias-free linear layer (Hu et al. 2021; TorchTune's LoRALinear, FrozenNF4Linear and
// QATLoRALinear; PEFT's names lora_A, lora_B), with the base weight dense or NF4 and 8da4w fake
// quantisation; and the switch that turns a model's adapters off (DPO's reference).
#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "models/nf4.h"

namespace mgbench::models {

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

/// The LoRA settings of a PEFT adapter directory's adapter_config.json ("r", "lora_alpha",
/// "target_modules"; dropout left at 0: an adapter is evaluated or merged, not trained). Throws
/// DataError naming the file when it is missing, not JSON, or a field is absent or out of its
/// bounds (r a whole number >= 1, lora_alpha a finite number above 0, target_modules a list of
/// strings); ConfigError naming the file for PEFT variants mgbench's LoRA does not compute
/// (use_rslora, use_dora, a per-module rank_pattern / alpha_pattern).
LoraOptions read_adapter_config(const std::string& adapter_dir);

/// How the decoder layers' projections hold their frozen base weights.
enum class BaseWeights {
  kDense,  // a parameter in the model's dtype
  kNf4,    // NF4 (models/nf4.h): QLoRA's base, TorchTune's quantize_base=True
};

/// A bias-free linear layer that can carry a LoRA adapter (children "lora_A", "lora_B", PEFT's
/// names), hold its base weight in NF4, and fake-quantise its input and weight (8da4w QAT,
/// models/fake_quant.h). TorchTune's LoRALinear, FrozenNF4Linear and QATLoRALinear, and torchao's
/// Int8DynActInt4WeightQATLinear, as one layer:
///   y = base(x) + B ((alpha / rank) A dropout(x))  (the adapter's term while enabled; the scaling
///                                                  on the [N, rank] activations, not the [N, out]
///                                                  product as TorchTune and PEFT do: the same
///                                                  values when alpha / rank is a power of two, as
///                                                  the defaults'),
///   base(x) = x W^T, W^ = dequantised NF4          (NF4: torchao's linear_nf4; only the packed
///                                                  weight is kept for backward, which dequantises
///                                                  again),
///           = fq_a(x) fq_w(W)^T                    (fake quantisation on),
///           = x W^T                                (otherwise).
/// The whole of it is one autograd node (lora.cpp's Projection): three GEMMs forward on [N, in]
/// views, the adapter's product added into the base output by addmm (one rounding where TorchTune
/// rounds the two terms and their sum: within one rounding of TorchTune's output), and backward the
/// GEMMs of the gradients that are needed (issue 47: the host's ops per decoder layer).
class LoraLinearImpl : public torch::nn::Module {
 public:
  /// kDense: parameter "weight" [out, in] in the default dtype, uninitialised (the model
  /// initialises it); kNf4: no weight parameter until quantize_base() gives the NF4 weight.
  LoraLinearImpl(std::int64_t in_features, std::int64_t out_features, BaseWeights base = BaseWeights::kDense);
  /// x: [..., in] -> [..., out], in x's dtype (the compute dtype under autocast). Throws
  /// std::invalid_argument when x does not end in in_features.
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

}  // namespace mgbench::models
