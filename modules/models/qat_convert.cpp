#include "models/qat_convert.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "models/fake_quant.h"
#include "models/json_file.h"
#include "models/llama.h"
#include "models/safetensors.h"

namespace mgbench::models {
namespace {

namespace fs = std::filesystem;

struct QatConfig {
  std::int64_t group_size = 0;
  std::vector<std::string> linears;
};

QatConfig read_qat_config(const fs::path& path) {
  MGBENCH_REQUIRE(fs::exists(path), DataError,
                  "'{}' not found: not the output of a QAT run (--recipe qat, or qat-lora with --adapter)",
                  path.string());
  const nlohmann::json j = read_json_file(path.string());
  QatConfig c;
  try {
    MGBENCH_REQUIRE(j.value("scheme", std::string()) == "8da4w", DataError,
                    "'{}': field \"scheme\" is \"{}\", expected \"8da4w\"", path.string(),
                    j.value("scheme", std::string()));
    c.group_size = json_integer(j.at("group_size"));
    c.linears = j.at("linears").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("'{}': expected fields \"group_size\" (integer) and \"linears\" (names): {}",
                                path.string(), e.what()));
  }
  MGBENCH_REQUIRE(c.group_size >= 2, DataError, "'{}': \"group_size\" {} (expected >= 2)", path.string(), c.group_size);
  MGBENCH_REQUIRE(!c.linears.empty(), DataError, "'{}': \"linears\" is empty", path.string());
  // A name twice was refused later as a tensor "given twice" to the output file, naming that file.
  std::set<std::string> names;
  for (const auto& name : c.linears) {
    MGBENCH_REQUIRE(names.insert(name).second, DataError, "'{}': \"linears\" names layer '{}' twice", path.string(),
                    name);
  }
  return c;
}

/// The checkpoint's weights' dtype (its embedding's).
torch::ScalarType checkpoint_dtype(const std::string& dir) {
  const SafetensorsCheckpoint checkpoint(dir);
  MGBENCH_REQUIRE(checkpoint.contains("model.embed_tokens.weight"), DataError,
                  "checkpoint '{}': tensor 'model.embed_tokens.weight' is missing", dir);
  return checkpoint.tensor("model.embed_tokens.weight").scalar_type();
}

}  // namespace

QatConvertResult convert_qat_checkpoint(const std::string& model_dir, const std::string& adapter_dir,
                                        const std::string& output_dir) {
  for (const auto& [input, option] : {std::pair{model_dir, "--model"}, std::pair{adapter_dir, "--adapter"}}) {
    std::error_code ec;
    MGBENCH_REQUIRE(input.empty() || !fs::equivalent(input, output_dir, ec), ConfigError,
                    "--output '{}' is {} '{}': the trained weights would be overwritten by their int4 values; give "
                    "another directory",
                    output_dir, option, input);
  }
  const std::string shadowed = shadowing_index(output_dir);
  MGBENCH_REQUIRE(shadowed.empty(), ConfigError, "--output '{}': {}; give another directory", output_dir, shadowed);
  const QatConfig qat = read_qat_config(fs::path(adapter_dir.empty() ? model_dir : adapter_dir) / "qat_config.json");
  const fs::path config_path = fs::path(model_dir) / "config.json";
  const LlamaConfig config = LlamaConfig::from_hf_json(config_path.string());
  nlohmann::json config_json = read_json_file(config_path.string());
  // An earlier quantize's output holds a qat_config.json too, and int4 tensors in place of the
  // layers' weights: named as what it is (was: "tensor '...q_proj.weight' is missing").
  const auto quantized = config_json.find("quantization_config");
  MGBENCH_REQUIRE(quantized == config_json.end() || !quantized->is_object() ||
                      quantized->value("quant_method", std::string()) != "8da4w",
                  DataError,
                  "--model '{}' is quantized already (its config.json has quantization_config 8da4w: the output of "
                  "mgbench quantize); give the QAT run's --output-dir",
                  model_dir);
  const torch::ScalarType dtype = checkpoint_dtype(model_dir);
  LlamaForCausalLM model{nullptr};
  {
    const caffe2::TypeMeta previous = torch::get_default_dtype();
    torch::set_default_dtype(caffe2::TypeMeta::fromScalarType(dtype));
    try {
      model = LlamaForCausalLM(config);
    } catch (...) {
      torch::set_default_dtype(previous);
      throw;
    }
    torch::set_default_dtype(previous);
  }
  model->load_hf_checkpoint(model_dir);

  std::map<std::string, LoraLinearImpl*> linears;
  for (const auto& item : model->named_modules("", /*include_self=*/false)) {
    if (auto* layer = item.value()->as<LoraLinearImpl>()) linears.emplace(item.key(), layer);
  }
  if (!adapter_dir.empty()) {
    const fs::path adapter_config = fs::path(adapter_dir) / "adapter_config.json";
    const LoraOptions lora = read_adapter_config(adapter_dir);
    try {
      model->apply_lora(lora);
    } catch (const ConfigError& e) {
      throw DataError(fmt::format("'{}': {}", adapter_config.string(), e.what()));
    }
    model->load_lora_adapter((fs::path(adapter_dir) / "adapter_model.safetensors").string());
    for (auto& [name, layer] : linears) {
      if (layer->has_lora()) layer->merge_lora();
    }
  }

  const std::set<std::string> converted(qat.linears.begin(), qat.linears.end());
  for (const auto& name : converted) {
    const auto it = linears.find(name);
    MGBENCH_REQUIRE(it != linears.end(), DataError, "qat_config.json: '{}' is not a linear layer of the model '{}'",
                    name, model_dir);
    MGBENCH_REQUIRE(it->second->in_features % qat.group_size == 0, DataError,
                    "qat_config.json: '{}' has {} in-features, not a multiple of group_size {}", name,
                    it->second->in_features, qat.group_size);
  }
  QatConvertResult result;
  result.group_size = qat.group_size;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto& [name, tensor] : model->hf_state_dict()) {
    const std::string module = name.substr(0, name.rfind('.'));
    if (converted.count(module) == 0) tensors.emplace_back(name, tensor);
  }
  for (const auto& name : qat.linears) {
    const LoraLinearImpl& layer = *linears.at(name);
    const Int4GroupWeight q = quantize_per_group_int4(layer.weight, qat.group_size);
    torch::Tensor packed = pack_int4(q.values);
    result.dense_bytes += static_cast<std::int64_t>(layer.weight.nbytes());
    result.int4_bytes += static_cast<std::int64_t>(packed.nbytes() + q.scales.nbytes() + q.zeros.nbytes());
    tensors.emplace_back(name + ".qweight", std::move(packed));
    tensors.emplace_back(name + ".scales", q.scales.contiguous());
    tensors.emplace_back(name + ".zeros", q.zeros.contiguous());
    ++result.converted;
  }

  const fs::path out(output_dir);
  fs::create_directories(out);
  write_safetensors((out / "model.safetensors").string(), tensors,
                    {{"format", "pt"}, {"quantization", "8da4w"}, {"group_size", std::to_string(qat.group_size)}});
  config_json["quantization_config"] = {{"quant_method", "8da4w"},
                                        {"group_size", qat.group_size},
                                        {"weight", "int4 symmetric per group, packed two per byte (qweight)"},
                                        {"activation", "int8 asymmetric per token, dynamic"},
                                        {"modules", qat.linears}};
  write_json_file((out / "config.json").string(), config_json);
  write_json_file((out / "qat_config.json").string(),
                  {{"scheme", "8da4w"}, {"group_size", qat.group_size}, {"linears", qat.linears}});
  return result;
}

void QuantizeOptions::declare(options::OptionTable& t) {
  t.add("model", model, "Hugging Face checkpoint: a qat run's --output-dir, or the base model of a qat-lora run")
      .required()
      .value_name("DIR");
  t.add("adapter", adapter, "a qat-lora run's --output-dir (adapters merged into --model first)").value_name("DIR");
  t.add("output", output, "directory for model.safetensors, config.json, qat_config.json").required().value_name("DIR");
}

int quantize(const QuantizeOptions& o, std::ostream& out, std::ostream& err) {
  try {
    const QatConvertResult r = convert_qat_checkpoint(o.model, o.adapter, o.output);
    constexpr double kMiB = 1024.0 * 1024.0;
    out << fmt::format(
        "quantize: {} linears to int4 (groups of {}): {:.2f} MiB -> {:.2f} MiB ({:.3f} of their bytes); {}\n",
        r.converted, r.group_size, static_cast<double>(r.dense_bytes) / kMiB, static_cast<double>(r.int4_bytes) / kMiB,
        static_cast<double>(r.int4_bytes) / static_cast<double>(r.dense_bytes), o.output);
  } catch (const ConfigError& e) {
    err << "mgbench quantize: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "mgbench quantize: " << error_message(e) << "\n";
    return 1;
  }
  return 0;
}

}  // namespace mgbench::models
