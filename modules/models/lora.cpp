#include "models/lora.h"

#include <fmt/format.h>

#include "core/error.h"
#include "models/fake_quant.h"
#include "models/state_dict.h"

namespace mgbench::models {

namespace nn = torch::nn;

std::vector<std::string> LoraOptions::hf_targets() const {
  std::vector<std::string> out;
  for (const auto& t : targets) {
    if (t == "output_proj" || t == "o_proj") {
      out.emplace_back("o_proj");
    } else if (t == "mlp") {
      out.insert(out.end(), {"gate_proj", "up_proj", "down_proj"});
    } else if (t == "q_proj" || t == "k_proj" || t == "v_proj" || t == "gate_proj" || t == "up_proj" ||
               t == "down_proj") {
      out.push_back(t);
    } else {
      throw ConfigError(
          fmt::format("--lora-targets: unknown target '{}' (expected q_proj, k_proj, v_proj, output_proj, "
                      "mlp, or gate_proj / up_proj / down_proj)",
                      t));
    }
  }
  return out;
}

LoraLinearImpl::LoraLinearImpl(std::int64_t in, std::int64_t out, BaseWeights base)
    : in_features(in), out_features(out), base_(base), dtype_(torch::typeMetaToScalarType(torch::get_default_dtype())) {
  if (base_ == BaseWeights::kDense) weight = register_parameter("weight", torch::empty({out, in}));
}

void LoraLinearImpl::enable_lora(std::int64_t rank, double alpha, double dropout_p) {
  const torch::Device device = is_nf4() ? nf4.device() : weight.device();
  lora_a = register_module("lora_A", nn::Linear(nn::LinearOptions(in_features, rank).bias(false)));
  lora_b = register_module("lora_B", nn::Linear(nn::LinearOptions(rank, out_features).bias(false)));
  lora_a->to(device, dtype_);
  lora_b->to(device, dtype_);
  torch::NoGradGuard no_grad;
  lora_b->weight.zero_();  // the adapted model starts equal to the base model
  dropout = register_module("lora_dropout", nn::Dropout(dropout_p));
  scaling = alpha / static_cast<double>(rank);
  if (!is_nf4()) weight.set_requires_grad(false);
}

void LoraLinearImpl::quantize_base(const torch::Tensor& dense) {
  MGBENCH_REQUIRE(is_nf4(), std::logic_error, "quantize_base: the layer holds a dense weight");
  MGBENCH_REQUIRE(dense.dim() == 2 && dense.size(0) == out_features && dense.size(1) == in_features,
                  std::invalid_argument, "quantize_base: a weight of shape {}, expected [{}, {}]",
                  shape_text(dense.sizes()), out_features, in_features);
  nf4 = Nf4Weight::quantize(dense.to(dtype_));
}

void LoraLinearImpl::enable_fake_quant(std::int64_t group_size) {
  MGBENCH_REQUIRE(!is_nf4(), std::invalid_argument, "fake quantisation of an NF4 weight");
  MGBENCH_REQUIRE(group_size >= 2 && in_features % group_size == 0, std::invalid_argument,
                  "{} in-features do not split into groups of {}", in_features, group_size);
  fake_quant_group_ = group_size;
}

torch::Tensor LoraLinearImpl::base_input(const torch::Tensor& x) const {
  MGBENCH_REQUIRE(!is_nf4(), std::logic_error, "base_input of an NF4 layer");
  return fake_quant_active() ? fake_quantize_per_token_int8(x) : x;
}

torch::Tensor LoraLinearImpl::base_weight() const {
  MGBENCH_REQUIRE(!is_nf4(), std::logic_error, "base_weight of an NF4 layer");
  return fake_quant_active() ? fake_quantize_per_group_int4(weight, fake_quant_group_) : weight;
}

torch::Tensor LoraLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor out = is_nf4() ? linear_nf4(x, nf4) : torch::nn::functional::linear(base_input(x), base_weight());
  // The scaling on the rank-r activations ([N, r], not [N, out]): one small multiply each way.
  if (has_lora() && adapter_enabled) out = out + lora_b(lora_a(dropout(x)) * scaling);
  return out;
}

void LoraLinearImpl::merge_lora() {
  MGBENCH_REQUIRE(has_lora() && !is_nf4(), std::logic_error, "merge_lora: needs an adapter on a dense weight");
  torch::NoGradGuard no_grad;
  weight.add_(torch::matmul(lora_b->weight, lora_a->weight) * scaling);
  adapter_enabled = false;
}

std::int64_t LoraLinearImpl::base_nbytes() const {
  return is_nf4() ? nf4.nbytes() : static_cast<std::int64_t>(weight.nbytes());
}

void LoraLinearImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  Module::to(device, dtype, non_blocking);
  nf4.to(device, non_blocking);
  if (!is_nf4()) dtype_ = dtype;
}

void LoraLinearImpl::to(torch::Dtype dtype, bool non_blocking) {
  Module::to(dtype, non_blocking);
  if (!is_nf4()) dtype_ = dtype;
}

void LoraLinearImpl::to(torch::Device device, bool non_blocking) {
  Module::to(device, non_blocking);
  nf4.to(device, non_blocking);
}

AdaptersDisabled::AdaptersDisabled(torch::nn::Module& model) {
  for (const auto& module : model.modules(/*include_self=*/true)) {
    if (auto* layer = dynamic_cast<LoraLinearImpl*>(module.get()); layer != nullptr && layer->adapter_enabled) {
      layer->adapter_enabled = false;
      layers_.push_back(layer);
    }
  }
}

AdaptersDisabled::~AdaptersDisabled() {
  for (auto* layer : layers_) layer->adapter_enabled = true;
}

}  // namespace mgbench::models
