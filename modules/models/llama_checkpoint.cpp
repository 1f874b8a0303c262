// LlamaForCausalLM's Hugging Face checkpoints: loaded by name from safetensors (single or sharded),
// NF4 projections quantised tensor by tensor; the dense weights under Hugging Face's names
// (models/llama.h).
#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "models/llama.h"
#include "models/llama_checkpoint.h"
#include "models/safetensors.h"
#include "models/state_dict.h"

namespace mgbench::models {

void require_finite(const torch::Tensor& t, std::int64_t offset, const std::string& where) {
  if (!t.is_floating_point()) return;
  constexpr std::int64_t kPiece = std::int64_t{1} << 22;
  const torch::Tensor flat = t.reshape({-1});
  for (std::int64_t start = 0; start < flat.numel(); start += kPiece) {
    const torch::Tensor piece = flat.narrow(0, start, std::min(kPiece, flat.numel() - start));
    if (torch::isfinite(piece).all().item<bool>()) continue;
    const torch::Tensor bad = torch::nonzero(~torch::isfinite(flat));
    const std::int64_t first = bad[0][0].item<std::int64_t>();
    throw DataError(fmt::format("{} holds {} non-finite value(s), the first {} at flat index {}", where, bad.size(0),
                                flat[first].item<double>(), offset + first));
  }
}

LlamaCheckpointReader::LlamaCheckpointReader(const std::string& dir, bool tied) : dir_(dir), checkpoint_(dir) {
  for (const auto& name : checkpoint_.names()) {
    if (name.find("rotary_emb.inv_freq") == std::string::npos) unused_.insert(name);
  }
  // A tied checkpoint may still carry lm_head.weight (equal to the embedding): accept it.
  if (tied) unused_.erase("lm_head.weight");
}

void LlamaCheckpointReader::load_nf4(const std::string& prefix, torch::nn::Module& part, torch::Device device) {
  torch::NoGradGuard no_grad;
  for (const auto& item : part.named_modules(prefix)) {
    auto* layer = item.value()->as<LoraLinearImpl>();
    if (layer == nullptr || !layer->is_nf4()) continue;
    const std::string name = item.key() + ".weight";
    MGBENCH_REQUIRE(checkpoint_.contains(name), DataError, "checkpoint '{}': tensor '{}' is missing", dir_, name);
    const torch::Tensor t = checkpoint_.tensor(name);
    MGBENCH_REQUIRE(t.dim() == 2 && t.size(0) == layer->out_features && t.size(1) == layer->in_features, DataError,
                    "checkpoint '{}': tensor '{}' in {} has shape {}, the model (config.json) expects [{}, {}]", dir_,
                    name, checkpoint_.file_of(name), shape_text(t.sizes()), layer->out_features, layer->in_features);
    MGBENCH_REQUIRE(t.is_floating_point(), DataError,
                    "checkpoint '{}': tensor '{}' in {} is {}, expected a float dtype", dir_, name,
                    checkpoint_.file_of(name), c10::toString(t.scalar_type()));
    require_finite(t, 0, fmt::format("checkpoint '{}': tensor '{}' in {}", dir_, name, checkpoint_.file_of(name)));
    try {
      layer->quantize_base(t.to(device));
    } catch (const std::invalid_argument& e) {
      throw DataError(fmt::format("checkpoint '{}': tensor '{}': {}", dir_, name, e.what()));
    }
    unused_.erase(name);
  }
}

void LlamaCheckpointReader::read_rows(const std::string& name, c10::IntArrayRef sizes, std::int64_t first_row,
                                      const torch::Tensor& rows) {
  MGBENCH_REQUIRE(checkpoint_.contains(name), DataError, "checkpoint '{}': tensor '{}' is missing", dir_, name);
  const std::vector<std::int64_t>& shape = checkpoint_.shape(name);
  MGBENCH_REQUIRE(c10::IntArrayRef(shape) == sizes, DataError,
                  "checkpoint '{}': tensor '{}' in {} has shape {}, the model (config.json) expects {}", dir_, name,
                  checkpoint_.file_of(name), shape_text(shape), shape_text(sizes));
  torch::NoGradGuard no_grad;
  checkpoint_.read_rows(name, first_row, rows);
  const std::int64_t row_numel = sizes.empty() ? 1 : c10::multiply_integers(sizes.begin() + 1, sizes.end());
  require_finite(rows, first_row * row_numel,
                 fmt::format("checkpoint '{}': tensor '{}' in {}", dir_, name, checkpoint_.file_of(name)));
  unused_.erase(name);
}

void LlamaCheckpointReader::finish() const {
  MGBENCH_REQUIRE(unused_.empty(), DataError, "checkpoint '{}': tensor '{}' in {} is not part of the model", dir_,
                  unused_.empty() ? std::string() : *unused_.begin(),
                  unused_.empty() ? std::string() : checkpoint_.file_of(*unused_.begin()));
}

void LlamaForCausalLMImpl::load_hf_checkpoint(const std::string& dir) {
  LlamaCheckpointReader reader(dir, config_.tie_word_embeddings);
  // NF4 projections: each tensor quantised as it is read, so the dense model never exists whole.
  reader.load_nf4("", *this, device_);
  for (auto& p : named_parameters()) {
    if (p.key().find(".lora_") != std::string::npos) continue;  // adapters are not part of a base checkpoint
    reader.read_rows(p.key(), p.value().sizes(), 0, p.value());
  }
  reader.finish();
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
