// LlamaForCausalLM's adapters and fake quantisation: LoRA applied to the targeted projections, the
// adapters in PEFT's names and files, 8da4w fake quantisation of the linears TorchTune's QAT recipes
// give it (models/llama.h).
#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "models/llama.h"
#include "models/llama_checkpoint.h"
#include "models/safetensors.h"
#include "models/state_dict.h"

namespace mgbench::models {
namespace {

constexpr const char* kPeftPrefix = "base_model.model.";

}  // namespace

std::vector<std::string> LlamaForCausalLMImpl::enable_fake_quant(std::int64_t group_size, bool lora_only,
                                                                 std::vector<std::string>* skipped) {
  MGBENCH_REQUIRE(base_ == BaseWeights::kDense, ConfigError,
                  "fake quantisation (QAT) needs dense base weights, not NF4 (--quantize-base)");
  MGBENCH_REQUIRE(group_size >= 2, ConfigError, "--qat-group-size {}: expected >= 2", group_size);
  std::vector<std::string> done;
  for (const auto& item : named_modules("", /*include_self=*/false)) {
    auto* layer = item.value()->as<LoraLinearImpl>();
    if (layer == nullptr || (lora_only && !layer->has_lora())) continue;
    if (layer->in_features % group_size != 0) {
      MGBENCH_REQUIRE(!lora_only, ConfigError,
                      "--qat-group-size {}: {} has {} in-features, not a multiple (TorchTune's QATLoRALinear refuses "
                      "it)",
                      group_size, item.key(), layer->in_features);
      if (skipped != nullptr) skipped->push_back(item.key());
      continue;
    }
    layer->enable_fake_quant(group_size);
    done.push_back(item.key());
  }
  return done;
}

void LlamaForCausalLMImpl::set_fake_quant_enabled(bool on) {
  for (const auto& module : modules(/*include_self=*/false)) {
    if (auto* layer = module->as<LoraLinearImpl>()) layer->fake_quant_enabled = on;
  }
}

std::vector<torch::Tensor> LlamaForCausalLMImpl::apply_lora(const LoraOptions& options) {
  MGBENCH_REQUIRE(options.rank >= 1, ConfigError, "--lora-rank {}: expected >= 1", options.rank);
  MGBENCH_REQUIRE(options.alpha > 0, ConfigError, "--lora-alpha {}: expected > 0", options.alpha);
  MGBENCH_REQUIRE(options.dropout >= 0 && options.dropout < 1, ConfigError, "--lora-dropout {}: expected [0, 1)",
                  options.dropout);
  const auto targets = options.hf_targets();
  lora_dropout_ = options.dropout;
  for (auto& p : parameters()) p.set_requires_grad(false);
  for (const auto& layer_module : *model->layers) {
    auto* layer = layer_module->as<LlamaDecoderLayerImpl>();
    std::pair<const char*, LoraLinear> projections[] = {
        {"q_proj", layer->self_attn->q_proj}, {"k_proj", layer->self_attn->k_proj},
        {"v_proj", layer->self_attn->v_proj}, {"o_proj", layer->self_attn->o_proj},
        {"gate_proj", layer->mlp->gate_proj}, {"up_proj", layer->mlp->up_proj},
        {"down_proj", layer->mlp->down_proj}};
    for (auto& [name, projection] : projections) {
      if (std::find(targets.begin(), targets.end(), name) != targets.end()) {
        projection->enable_lora(options.rank, options.alpha, options.dropout);
      }
    }
  }
  std::vector<torch::Tensor> trainable;
  for (const auto& p : named_parameters()) {
    if (p.key().find(".lora_") != std::string::npos) trainable.push_back(p.value());
  }
  return trainable;
}

std::vector<std::pair<std::string, torch::Tensor>> LlamaForCausalLMImpl::lora_state_dict() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : named_parameters()) {
    if (p.key().find(".lora_") != std::string::npos) out.emplace_back(kPeftPrefix + p.key(), p.value());
  }
  return out;
}

void LlamaForCausalLMImpl::load_lora_adapter(const std::string& path) {
  const SafetensorsFile file(path);
  std::set<std::string> unused;
  for (const auto& name : file.names()) unused.insert(name);
  torch::NoGradGuard no_grad;
  std::size_t loaded = 0;
  for (auto& [name, tensor] : lora_state_dict()) {
    MGBENCH_REQUIRE(file.contains(name), DataError,
                    "adapter '{}': tensor '{}' is missing (adapter made with other "
                    "--lora-targets?)",
                    path, name);
    const torch::Tensor t = file.tensor(name);
    MGBENCH_REQUIRE(t.sizes() == tensor.sizes(), DataError,
                    "adapter '{}': tensor '{}' has shape {}, expected {} (another --lora-rank?)", path, name,
                    shape_text(t.sizes()), shape_text(tensor.sizes()));
    MGBENCH_REQUIRE(t.is_floating_point(), DataError, "adapter '{}': tensor '{}' is {}, expected a float dtype", path,
                    name, c10::toString(t.scalar_type()));
    require_finite(t, 0, fmt::format("adapter '{}': tensor '{}'", path, name));
    tensor.copy_(t);
    unused.erase(name);
    ++loaded;
  }
  MGBENCH_REQUIRE(loaded > 0, DataError, "adapter '{}': the model has no LoRA adapters (apply_lora first)", path);
  MGBENCH_REQUIRE(unused.empty(), DataError, "adapter '{}': tensor '{}' is not an adapter of this model", path,
                  unused.empty() ? std::string() : *unused.begin());
}

}  // namespace mgbench::models
