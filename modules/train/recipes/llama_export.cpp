// The Llama component's adapters and exports: a PEFT adapter loaded for evaluation, what was trained
// written as PEFT adapters or a Hugging Face checkpoint (with QAT's configuration).
#include "train/recipes/llama_finetune.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/durable.h"
#include "core/error.h"
#include "core/log.h"
#include "models/json_file.h"
#include "models/safetensors.h"

namespace mgbench::train {
namespace {

namespace fs = std::filesystem;

}  // namespace

void LlamaFinetune::load_adapter(const std::string& dir) {
  const models::LoraOptions adapter = models::read_adapter_config(dir);
  std::vector<std::string> differ;
  std::vector<std::string> fixes;
  if (adapter.rank != lora_.rank) {
    differ.push_back(fmt::format("r {} (--lora-rank {})", adapter.rank, lora_.rank));
    fixes.push_back(fmt::format("--lora-rank {}", adapter.rank));
  }
  if (adapter.alpha != lora_.alpha) {
    differ.push_back(fmt::format("lora_alpha {:g} (--lora-alpha {:g})", adapter.alpha, lora_.alpha));
    fixes.push_back(fmt::format("--lora-alpha {:g}", adapter.alpha));
  }
  std::vector<std::string> their_targets = adapter.hf_targets();  // PEFT's names, or TorchTune's
  std::vector<std::string> our_targets = lora_.hf_targets();
  std::sort(their_targets.begin(), their_targets.end());
  std::sort(our_targets.begin(), our_targets.end());
  if (their_targets != our_targets) {
    differ.push_back(fmt::format("target_modules {} (--lora-targets {})", fmt::join(their_targets, ","),
                                 fmt::join(our_targets, ",")));
    fixes.push_back(fmt::format("--lora-targets {}", fmt::join(their_targets, ",")));
  }
  MGBENCH_REQUIRE(differ.empty(), ConfigError,
                  "--adapter {}: adapter_config.json differs from this run's adapters: {}; "
                  "give {}",
                  dir, fmt::join(differ, ", "), fmt::join(fixes, " "));
  model_->load_lora_adapter((fs::path(dir) / "adapter_model.safetensors").string());
}

std::vector<TensorExport> LlamaFinetune::exports() const {
  if (output_dir_.empty()) return {};
  const fs::path dir(output_dir_);
  if (finetune_ == Finetune::kLora) {
    return {{(dir / "adapter_model.safetensors").string(), model_->lora_state_dict(), {{"format", "pt"}}}};
  }
  return {{(dir / "model.safetensors").string(), model_->hf_state_dict(), {{"format", "pt"}}}};
}

void LlamaFinetune::prepare_output_dir() const {
  if (output_dir_.empty()) return;
  // The checkpoint read: its weights and config.json overwritten at the end (a sharded one's index
  // shadowed the new file and was refused below; a single file was overwritten silently).
  std::error_code ec;
  MGBENCH_REQUIRE(!fs::equivalent(output_dir_, model_name_, ec), ConfigError,
                  "--output-dir '{}' is --model '{}': the checkpoint the run reads would be overwritten; give another "
                  "directory",
                  output_dir_, model_name_);
  const std::string problem = make_writable_directory(output_dir_);
  MGBENCH_REQUIRE(problem.empty(), ConfigError, "--output-dir '{}': {}: what the run trains would be lost at its end",
                  output_dir_, problem);
  if (finetune_ != Finetune::kLora) {
    const std::string shadowed = models::shadowing_index(output_dir_);
    MGBENCH_REQUIRE(shadowed.empty(), ConfigError,
                    "--output-dir '{}': {}; give another --output-dir (or remove the index and its shards)",
                    output_dir_, shadowed);
  }
}

void LlamaFinetune::save() const {
  if (output_dir_.empty()) return;
  const fs::path dir(output_dir_);
  fs::create_directories(dir);
  if (finetune_ == Finetune::kLora) {
    models::write_json_file((dir / "adapter_config.json").string(), {{"peft_type", "LORA"},
                                                                     {"task_type", "CAUSAL_LM"},
                                                                     {"r", lora_.rank},
                                                                     {"lora_alpha", lora_.alpha},
                                                                     {"lora_dropout", lora_.dropout},
                                                                     {"target_modules", lora_.hf_targets()},
                                                                     {"bias", "none"},
                                                                     {"fan_in_fan_out", false},
                                                                     {"inference_mode", true},
                                                                     {"base_model_name_or_path", model_name_}});
    log::info("adapters: {} (PEFT format)", dir.string());
  } else {
    // The weights' dtype (their sizes and dtype stand while FSDP holds them sharded).
    const torch::ScalarType dtype = model_->hf_state_dict().front().second.scalar_type();
    models::write_json_file((dir / "config.json").string(), nlohmann::json::parse(model_->config().to_hf_json(dtype)));
    log::info("model: {} (Hugging Face format)", dir.string());
  }
  const fs::path qat_config = dir / "qat_config.json";
  if (fake_quant_ == FakeQuant::k8da4w) {
    models::write_json_file(qat_config.string(),
                            {{"scheme", "8da4w"}, {"group_size", qat_group_size_}, {"linears", fake_quantized_}});
  } else if (std::error_code ec; (finetune_ != Finetune::kLora || !fs::exists(dir / "model.safetensors", ec)) &&
                                 fs::remove(qat_config, ec)) {
    // An earlier QAT run's, of the model (or adapters) this run wrote over in a reused --output-dir:
    // `mgbench quantize` would take them for QAT-trained ones. (Adapters written beside a QAT
    // model leave that model's.)
    log::info("{}: removed (an earlier QAT run's; this run trained without fake quantisation)", qat_config.string());
  }
}

}  // namespace mgbench::train
