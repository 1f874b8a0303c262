// The Llama component's adapters and exports: a PEFT adapter loaded for evaluation, what was trained
// written as PEFT adapters or a Hugging Face checkpoint (with QAT's configuration).
#include "train/recipes/llama_finetune.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "models/json_file.h"
#include "models/safetensors.h"

namespace mgbench::train {
namespace {

namespace fs = std::filesystem;

}  // namespace

void LlamaFinetune::load_adapter(const std::string& dir) {
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
  const nlohmann::json config = models::read_json_file(config_path, "adapter configuration");
  std::vector<std::string> differ;
  std::vector<std::string> fixes;
  const auto number = [&](const char* key) -> double {
    MGBENCH_REQUIRE(config.contains(key) && config[key].is_number(), DataError, "'{}': \"{}\" missing or not a number",
                    config_path, key);
    return config[key].get<double>();
  };
  // PEFT variants mgbench's LoRA does not compute: refused rather than evaluated wrongly.
  for (const char* key : {"use_rslora", "use_dora"}) {
    MGBENCH_REQUIRE(!config.contains(key) || !config[key].is_boolean() || !config[key].get<bool>(), ConfigError,
                    "--adapter {}: adapter_config.json has \"{}\": true, which mgbench's LoRA does not compute", dir,
                    key);
  }
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    MGBENCH_REQUIRE(!config.contains(key) || config[key].is_null() || config[key].empty(), ConfigError,
                    "--adapter {}: adapter_config.json has a per-module \"{}\", which mgbench's LoRA does not take",
                    dir, key);
  }
  const double r = number("r");
  const double alpha = number("lora_alpha");
  if (r != static_cast<double>(lora_.rank)) {
    differ.push_back(fmt::format("r {:g} (--lora-rank {})", r, lora_.rank));
    fixes.push_back(fmt::format("--lora-rank {:g}", r));
  }
  if (alpha != lora_.alpha) {
    differ.push_back(fmt::format("lora_alpha {:g} (--lora-alpha {:g})", alpha, lora_.alpha));
    fixes.push_back(fmt::format("--lora-alpha {:g}", alpha));
  }
  MGBENCH_REQUIRE(config.contains("target_modules") && config["target_modules"].is_array(), DataError,
                  "'{}': \"target_modules\" missing or not a list", config_path);
  std::vector<std::string> theirs;
  for (const auto& t : config["target_modules"]) {
    MGBENCH_REQUIRE(t.is_string(), DataError, "'{}': \"target_modules\" holds a non-string", config_path);
    theirs.push_back(t.get<std::string>());
  }
  models::LoraOptions adapter = lora_;
  adapter.targets = theirs;
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
  std::error_code ec;
  fs::create_directories(output_dir_, ec);  // every rank: concurrent creation of one path is no error
  const bool dir = !ec && fs::is_directory(output_dir_, ec);
  MGBENCH_REQUIRE(dir && ::access(output_dir_.c_str(), W_OK) == 0, ConfigError,
                  "--output-dir '{}': {}: what the run trains would be lost at its end", output_dir_,
                  ec    ? ec.message()
                  : dir ? "not writable"
                        : "not a directory");
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
  if (fake_quant_ == FakeQuant::k8da4w) {
    models::write_json_file((dir / "qat_config.json").string(),
                            {{"scheme", "8da4w"}, {"group_size", qat_group_size_}, {"linears", fake_quantized_}});
  }
}

}  // namespace mgbench::train
