// LlamaForCausalLM's Hugging Face checkpoints: loaded by name from safetensors (single or sharded),
// NF4 projections quantised tensor by tensor; the dense weights under Hugging Face's names
// (models/llama.h).
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "models/llama.h"
#include "models/safetensors.h"
#include "models/state_dict.h"

namespace mgbench::models {

namespace {
/// A base weight with NaN or Inf would evaluate to `eval loss: nan` and train nothing: refused at
/// load, naming the tensor and its first bad element (one pass over the weights).
void require_finite(const torch::Tensor& t, const std::string& dir, const std::string& name, const std::string& file) {
  if (!t.is_floating_point() || torch::isfinite(t).all().item<bool>()) return;
  const torch::Tensor bad = torch::nonzero(~torch::isfinite(t.reshape({-1})));
  const std::int64_t first = bad[0][0].item<std::int64_t>();
  throw DataError(
      fmt::format("checkpoint '{}': tensor '{}' in {} holds {} non-finite value(s), the first {} at flat "
                  "index {}",
                  dir, name, file, bad.size(0), t.reshape({-1})[first].item<double>(), first));
}
}  // namespace

void LlamaForCausalLMImpl::load_hf_checkpoint(const std::string& dir) {
  const SafetensorsCheckpoint checkpoint(dir);
  std::set<std::string> unused;
  for (const auto& name : checkpoint.names()) {
    if (name.find("rotary_emb.inv_freq") == std::string::npos) unused.insert(name);
  }
  torch::NoGradGuard no_grad;
  // NF4 projections: each tensor quantised as it is read, so the dense model never exists whole.
  for (const auto& item : named_modules("", /*include_self=*/false)) {
    auto* layer = item.value()->as<LoraLinearImpl>();
    if (layer == nullptr || !layer->is_nf4()) continue;
    const std::string name = item.key() + ".weight";
    MGBENCH_REQUIRE(checkpoint.contains(name), DataError, "checkpoint '{}': tensor '{}' is missing", dir, name);
    const torch::Tensor t = checkpoint.tensor(name);
    MGBENCH_REQUIRE(t.dim() == 2 && t.size(0) == layer->out_features && t.size(1) == layer->in_features, DataError,
                    "checkpoint '{}': tensor '{}' in {} has shape {}, the model (config.json) expects [{}, {}]", dir,
                    name, checkpoint.file_of(name), shape_text(t.sizes()), layer->out_features, layer->in_features);
    require_finite(t, dir, name, checkpoint.file_of(name));
    try {
      layer->quantize_base(t.to(device_));
    } catch (const std::invalid_argument& e) {
      throw DataError(fmt::format("checkpoint '{}': tensor '{}': {}", dir, name, e.what()));
    }
    checkpoint.release(name);  // quantised: the file's pages need not stay resident
    unused.erase(name);
  }
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    if (name.find(".lora_") != std::string::npos) continue;  // adapters are not part of a base checkpoint
    MGBENCH_REQUIRE(checkpoint.contains(name), DataError, "checkpoint '{}': tensor '{}' is missing", dir, name);
    const torch::Tensor t = checkpoint.tensor(name);
    MGBENCH_REQUIRE(t.sizes() == p.value().sizes(), DataError,
                    "checkpoint '{}': tensor '{}' in {} has shape {}, the model (config.json) expects {}", dir, name,
                    checkpoint.file_of(name), shape_text(t.sizes()), shape_text(p.value().sizes()));
    require_finite(t, dir, name, checkpoint.file_of(name));
    p.value().copy_(t);
    checkpoint.release(name);  // copied: the file's pages need not stay resident
    unused.erase(name);
  }
  // A tied checkpoint may still carry lm_head.weight (equal to the embedding): accept it.
  if (config_.tie_word_embeddings) unused.erase("lm_head.weight");
  MGBENCH_REQUIRE(unused.empty(), DataError, "checkpoint '{}': tensor '{}' in {} is not part of the model", dir,
                  unused.empty() ? std::string() : *unused.begin(),
                  unused.empty() ? std::string() : checkpoint.file_of(*unused.begin()));
}

std::vector<std::pair<std::string, torch::Tensor>> LlamaForCausalLMImpl::hf_state_dict() const {
  MGBENCH_REQUIRE(base_ == BaseWeights::kDense, std::logic_error, "hf_state_dict of a model with NF4 weights");
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : named_parameters()) {
    if (p.key().find(".lora_") == std::string::npos) out.emplace_back(p.key(), p.value());
  }
  return out;
}

}  // namespace mgbench::models
