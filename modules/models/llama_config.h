#pragma once
// A Llama 3 model's sizes: read from and written as Hugging Face's config.json (transformers'
// LlamaConfig, model_type llama, rope_scaling llama3 or none), and the presets mgbench knows by
// name (Meta's configurations). Adding a preset: its row in llama_config.cpp.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <c10/core/ScalarType.h>

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
  /// config.json text as transformers writes a LlamaConfig (model_type llama, rope_scaling
  /// llama3 or none), weights stored in dtype; from_hf_json reads it back equal.
  std::string to_hf_json(c10::ScalarType dtype) const;
  /// The preset `name` (llama_presets()). Throws ConfigError naming --model and listing the presets
  /// for an unknown name.
  static LlamaConfig preset(const std::string& name);
  /// Throws ConfigError for inconsistent sizes.
  void validate() const;
  /// Parameters of the model (embedding and output counted once when tied).
  std::int64_t num_parameters() const;
};

/// A row of the preset table (--model NAME).
struct LlamaPreset {
  std::string_view name;
  std::string_view help;
  LlamaConfig config;
};
std::span<const LlamaPreset> llama_presets();
/// "llama3-8b, llama3.1-8b, llama3.2-1b or tiny": for help texts and messages.
std::string llama_preset_names();

}  // namespace mgbench::models
