#include "models/llama_config.h"

#include <cmath>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/option_table.h"
#include "models/json_file.h"

namespace mgbench::models {

void LlamaConfig::validate() const {
  MGBENCH_REQUIRE(vocab_size > 0 && hidden_size > 0 && intermediate_size > 0 && num_hidden_layers > 0, ConfigError,
                  "Llama config: vocab_size, hidden_size, intermediate_size, num_hidden_layers must be > 0");
  MGBENCH_REQUIRE(num_attention_heads > 0 && num_key_value_heads > 0 && num_attention_heads % num_key_value_heads == 0,
                  ConfigError, "Llama config: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                  num_attention_heads, num_key_value_heads);
  MGBENCH_REQUIRE(head_dim > 0 && head_dim % 2 == 0, ConfigError, "Llama config: head_dim {} must be even and > 0",
                  head_dim);
  MGBENCH_REQUIRE(rms_norm_eps > 0 && rope_theta > 0, ConfigError,
                  "Llama config: rms_norm_eps and rope_theta must be > 0");
  // The positions the model was trained at (was: 0 read on, refused later as --pad-to-multiple 1
  // padding "past the model's context of 0").
  MGBENCH_REQUIRE(max_position_embeddings > 0, ConfigError, "Llama config: max_position_embeddings {} must be > 0",
                  max_position_embeddings);
  if (rope_scaling) {
    // What llama_inv_freq divides by: each must be finite and positive, and the two wavelength
    // bounds apart (transformers only warns, and the frequencies came out NaN or infinite).
    const Llama3RopeScaling& s = *rope_scaling;
    MGBENCH_REQUIRE(std::isfinite(s.factor) && s.factor > 0 && std::isfinite(s.low_freq_factor) &&
                        s.low_freq_factor > 0 && std::isfinite(s.high_freq_factor) &&
                        s.high_freq_factor > s.low_freq_factor && s.original_max_position_embeddings > 0,
                    ConfigError,
                    "Llama config: rope scaling (llama3) factor {}, low_freq_factor {}, high_freq_factor {}, "
                    "original_max_position_embeddings {}: expected factor > 0, 0 < low_freq_factor < "
                    "high_freq_factor and original_max_position_embeddings > 0 (Llama 3.1: 8, 1, 4, 8192)",
                    s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position_embeddings);
  }
  // Bounds far above every Llama (3.1 405B: hidden 16384, intermediate 53248, 126 layers, 128
  // heads, vocabulary 128256), so that sizes are checked, and their products fit 64 bits, before
  // anything is allocated.
  const std::pair<const char*, std::int64_t> sizes[] = {{"vocab_size", vocab_size},
                                                        {"hidden_size", hidden_size},
                                                        {"intermediate_size", intermediate_size},
                                                        {"num_hidden_layers", num_hidden_layers},
                                                        {"num_attention_heads", num_attention_heads},
                                                        {"num_key_value_heads", num_key_value_heads},
                                                        {"head_dim", head_dim}};
  const std::int64_t limits[] = {std::int64_t{1} << 24, std::int64_t{1} << 17, std::int64_t{1} << 20,
                                 std::int64_t{1} << 12, std::int64_t{1} << 12, std::int64_t{1} << 12,
                                 std::int64_t{1} << 12};
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    MGBENCH_REQUIRE(sizes[i].second <= limits[i], ConfigError, "Llama config: {} {} is beyond any Llama (at most {})",
                    sizes[i].first, sizes[i].second, limits[i]);
  }
}

std::int64_t LlamaConfig::num_parameters() const {
  const std::int64_t attn = hidden_size * head_dim * (num_attention_heads * 2 + num_key_value_heads * 2);
  const std::int64_t mlp = 3 * hidden_size * intermediate_size;
  const std::int64_t layer = attn + mlp + 2 * hidden_size;
  return vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * layer + hidden_size;
}

LlamaConfig LlamaConfig::from_hf_json(const std::string& path) {
  const nlohmann::json j = read_json_file(path, "model config");
  auto field = [&](const char* name) -> const nlohmann::json& {
    MGBENCH_REQUIRE(j.contains(name) && !j[name].is_null(), DataError, "model config '{}': missing field \"{}\"", path,
                    name);
    return j[name];
  };
  LlamaConfig c;
  try {
    if (j.contains("model_type")) {
      const auto type = j["model_type"].get<std::string>();
      MGBENCH_REQUIRE(type == "llama", DataError, "model config '{}': model_type \"{}\", expected \"llama\"", path,
                      type);
    }
    // What this Llama computes -- SwiGLU over SiLU, projections without bias -- where a config says
    // otherwise (transformers' LlamaConfig reads these), the checkpoint is another model.
    const std::string act = j.contains("hidden_act") && !j["hidden_act"].is_null() ? j["hidden_act"].get<std::string>()
                                                                                   : std::string("silu");
    MGBENCH_REQUIRE(
        act == "silu", DataError,
        "model config '{}': hidden_act \"{}\", expected \"silu\" (Llama's SwiGLU; mgbench computes no other)", path,
        act);
    for (const char* bias : {"attention_bias", "mlp_bias"}) {
      MGBENCH_REQUIRE(!j.contains(bias) || j[bias].is_null() || !j[bias].get<bool>(), DataError,
                      "model config '{}': {} true, expected false (Llama's projections have no bias; mgbench's "
                      "neither, and would leave the checkpoint's biases out)",
                      path, bias);
    }
    c.vocab_size = json_integer(field("vocab_size"));
    c.hidden_size = json_integer(field("hidden_size"));
    c.intermediate_size = json_integer(field("intermediate_size"));
    c.num_hidden_layers = json_integer(field("num_hidden_layers"));
    c.num_attention_heads = json_integer(field("num_attention_heads"));
    c.num_key_value_heads =
        j.contains("num_key_value_heads") ? json_integer(j["num_key_value_heads"]) : c.num_attention_heads;
    c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? json_integer(j["head_dim"])
                                                                    : c.hidden_size / c.num_attention_heads;
    c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
    c.max_position_embeddings =
        j.contains("max_position_embeddings") ? json_integer(j["max_position_embeddings"]) : std::int64_t{2048};
    c.tie_word_embeddings = j.value("tie_word_embeddings", false);
    // RoPE: transformers <= 4 writes rope_theta + rope_scaling; transformers 5 rope_parameters.
    nlohmann::json rope = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? j["rope_parameters"]
                          : j.contains("rope_scaling") && j["rope_scaling"].is_object()     ? j["rope_scaling"]
                                                                                            : nlohmann::json::object();
    c.rope_theta = j.contains("rope_theta") ? j["rope_theta"].get<double>() : rope.value("rope_theta", 10000.0);
    const std::string rope_type = rope.value("rope_type", rope.value("type", std::string("default")));
    if (rope_type == "llama3") {
      Llama3RopeScaling s;
      s.factor = rope.at("factor").get<double>();
      s.low_freq_factor = rope.at("low_freq_factor").get<double>();
      s.high_freq_factor = rope.at("high_freq_factor").get<double>();
      s.original_max_position_embeddings = json_integer(rope.at("original_max_position_embeddings"));
      c.rope_scaling = s;
    } else {
      MGBENCH_REQUIRE(rope_type == "default", DataError,
                      "model config '{}': rope type \"{}\" is not supported (expected llama3 or default)", path,
                      rope_type);
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("model config '{}': a field has the wrong type ({})", path, e.what()));
  }
  try {
    c.validate();
  } catch (const ConfigError& e) {
    throw DataError(fmt::format("model config '{}': {}", path, e.what()));
  }
  return c;
}

std::string LlamaConfig::to_hf_json(c10::ScalarType dtype) const {
  nlohmann::json j{{"architectures", {"LlamaForCausalLM"}},
                   {"model_type", "llama"},
                   {"vocab_size", vocab_size},
                   {"hidden_size", hidden_size},
                   {"intermediate_size", intermediate_size},
                   {"num_hidden_layers", num_hidden_layers},
                   {"num_attention_heads", num_attention_heads},
                   {"num_key_value_heads", num_key_value_heads},
                   {"head_dim", head_dim},
                   {"rms_norm_eps", rms_norm_eps},
                   {"rope_theta", rope_theta},
                   {"max_position_embeddings", max_position_embeddings},
                   {"tie_word_embeddings", tie_word_embeddings},
                   {"hidden_act", "silu"},
                   {"attention_bias", false},
                   {"mlp_bias", false},
                   {"torch_dtype", dtype == c10::kBFloat16 ? "bfloat16"
                                   : dtype == c10::kHalf   ? "float16"
                                   : dtype == c10::kDouble ? "float64"
                                                           : "float32"}};
  if (rope_scaling) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", rope_scaling->factor},
                         {"low_freq_factor", rope_scaling->low_freq_factor},
                         {"high_freq_factor", rope_scaling->high_freq_factor},
                         {"original_max_position_embeddings", rope_scaling->original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  return j.dump(2);
}

namespace {

/// Meta-Llama-3-70B's sizes (the rest: LlamaConfig's defaults, Meta-Llama-3-8B's).
LlamaConfig llama3_70b() {
  LlamaConfig c;
  c.hidden_size = 8192;
  c.intermediate_size = 28672;
  c.num_hidden_layers = 80;
  c.num_attention_heads = 64;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  return c;
}

/// Llama 3.1's 128k context: llama3 rope scaling (factor 8) and 131,072 positions.
LlamaConfig with_128k_context(LlamaConfig c) {
  c.rope_scaling = Llama3RopeScaling{8.0, 1.0, 4.0, 8192};
  c.max_position_embeddings = 131072;
  return c;
}

// Meta's configurations (config.json of meta-llama/Meta-Llama-3-8B, Llama-3.1-8B, Llama-3.2-1B,
// Llama-3.2-3B, Meta-Llama-3-70B, Llama-3.1-70B, Llama-3.3-70B-Instruct) and a tiny one for tests and
// CPU demos; what a preset does not name is Meta-Llama-3-8B's (LlamaConfig's defaults).
const LlamaPreset kPresets[] = {
    {"llama3-8b", "Meta-Llama-3-8B", {}},
    {"llama3.1-8b", "Llama-3.1-8B (llama3 rope scaling, 128k context)", with_128k_context({})},
    {"llama3.2-1b",
     "Llama-3.2-1B (tied embeddings)",
     {.hidden_size = 2048,
      .intermediate_size = 8192,
      .num_hidden_layers = 16,
      .num_attention_heads = 32,
      .num_key_value_heads = 8,
      .head_dim = 64,
      .rope_scaling = Llama3RopeScaling{32.0, 1.0, 4.0, 8192},
      .max_position_embeddings = 131072,
      .tie_word_embeddings = true}},
    {"llama3.2-3b",
     "Llama-3.2-3B (tied embeddings)",
     {.hidden_size = 3072,
      .intermediate_size = 8192,
      .num_hidden_layers = 28,
      .num_attention_heads = 24,
      .num_key_value_heads = 8,
      .head_dim = 128,
      .rope_scaling = Llama3RopeScaling{32.0, 1.0, 4.0, 8192},
      .max_position_embeddings = 131072,
      .tie_word_embeddings = true}},
    {"llama3-70b", "Meta-Llama-3-70B", llama3_70b()},
    {"llama3.1-70b", "Llama-3.1-70B (llama3 rope scaling, 128k context)", with_128k_context(llama3_70b())},
    {"llama3.3-70b", "Llama-3.3-70B-Instruct (Llama-3.1-70B's shape)", with_128k_context(llama3_70b())},
    {"tiny",
     "2 layers, hidden 64: tests and CPU demos",
     {.hidden_size = 64,
      .intermediate_size = 128,
      .num_hidden_layers = 2,
      .num_attention_heads = 4,
      .num_key_value_heads = 2,
      .head_dim = 16,
      .rope_scaling = Llama3RopeScaling{8.0, 1.0, 4.0, 64},
      .max_position_embeddings = 2048}},
};

}  // namespace

std::span<const LlamaPreset> llama_presets() { return kPresets; }

std::string llama_preset_names() {
  std::vector<std::string_view> names;
  for (const auto& p : kPresets) names.push_back(p.name);
  return options::join_names(names);
}

LlamaConfig LlamaConfig::preset(const std::string& name) {
  for (const auto& p : kPresets) {
    if (p.name == name) return p.config;
  }
  throw ConfigError(
      fmt::format("--model '{}': unknown preset (presets: {}; or a directory with config.json and safetensors)", name,
                  llama_preset_names()));
}

}  // namespace mgbench::models
