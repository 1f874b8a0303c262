#include "models/llama.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/safetensors.h"

namespace mgbench::models {
namespace {

namespace nn = torch::nn;

LoraLinear linear(std::int64_t in, std::int64_t out) { return LoraLinear(in, out); }

constexpr const char* kPeftPrefix = "base_model.model.";

std::string dims(c10::IntArrayRef sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

/// HF's rotate_half: cat(-x2, x1) over the last dimension.
torch::Tensor rotate_half(const torch::Tensor& x) {
  const auto half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

/// Reentrant activation checkpoint of one decoder layer (the scheme of torch.utils.checkpoint's
/// use_reentrant=True): forward runs the layer without a graph and saves its input; backward
/// recomputes it with a graph and back-propagates through that, accumulating the layer's
/// parameter gradients and returning the input's. The RNG state is saved and restored, so dropout
/// draws the same masks in the recomputation.
class CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
 public:
  /// The generator dropout draws from for tensors on x's device.
  static torch::Generator generator_of(const torch::Tensor& x) {
    return at::globalContext().defaultGenerator(x.is_cuda() ? x.device() : torch::Device(torch::kCPU));
  }

  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::Tensor cos,
                               torch::Tensor sin, std::int64_t layer_address) {
    ctx->saved_data["layer"] = layer_address;
    ctx->saved_data["cos"] = cos;
    ctx->saved_data["sin"] = sin;
    ctx->saved_data["rng"] = generator_of(x).get_state();
    ctx->save_for_backward({x});
    auto* layer = reinterpret_cast<LlamaDecoderLayerImpl*>(layer_address);
    return layer->forward(x, cos, sin);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto* layer = reinterpret_cast<LlamaDecoderLayerImpl*>(ctx->saved_data["layer"].toInt());
    const torch::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    torch::Generator gen = generator_of(x);
    const torch::Tensor current = gen.get_state();
    gen.set_state(ctx->saved_data["rng"].toTensor());
    torch::Tensor out;
    {
      torch::AutoGradMode grad(true);
      out = layer->forward(x, ctx->saved_data["cos"].toTensor(), ctx->saved_data["sin"].toTensor());
    }
    gen.set_state(current);
    torch::autograd::backward({out}, {grad_outputs[0]});
    return {x.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

// ------------------------------------------------------------------ config
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
}

std::int64_t LlamaConfig::num_parameters() const {
  const std::int64_t attn = hidden_size * head_dim * (num_attention_heads * 2 + num_key_value_heads * 2);
  const std::int64_t mlp = 3 * hidden_size * intermediate_size;
  const std::int64_t layer = attn + mlp + 2 * hidden_size;
  return vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * layer + hidden_size;
}

LlamaConfig LlamaConfig::from_hf_json(const std::string& path) {
  std::ifstream in(path);
  MGBENCH_REQUIRE(in.good(), DataError, "model config '{}': cannot open the file", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("model config '{}': not valid JSON: {}", path, e.what()));
  }
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
    c.vocab_size = field("vocab_size").get<std::int64_t>();
    c.hidden_size = field("hidden_size").get<std::int64_t>();
    c.intermediate_size = field("intermediate_size").get<std::int64_t>();
    c.num_hidden_layers = field("num_hidden_layers").get<std::int64_t>();
    c.num_attention_heads = field("num_attention_heads").get<std::int64_t>();
    c.num_key_value_heads = j.value("num_key_value_heads", c.num_attention_heads);
    c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? j["head_dim"].get<std::int64_t>()
                                                                    : c.hidden_size / c.num_attention_heads;
    c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
    c.max_position_embeddings = j.value("max_position_embeddings", std::int64_t{2048});
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
      s.original_max_position_embeddings = rope.at("original_max_position_embeddings").get<std::int64_t>();
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

LlamaConfig LlamaConfig::preset(const std::string& name) {
  LlamaConfig c;  // defaults: Meta-Llama-3-8B
  if (name == "llama3-8b") return c;
  if (name == "llama3.1-8b") {
    c.rope_scaling = Llama3RopeScaling{8.0, 1.0, 4.0, 8192};
    c.max_position_embeddings = 131072;
    return c;
  }
  if (name == "llama3.2-1b") {
    c.hidden_size = 2048;
    c.intermediate_size = 8192;
    c.num_hidden_layers = 16;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 64;
    c.rope_scaling = Llama3RopeScaling{32.0, 1.0, 4.0, 8192};
    c.max_position_embeddings = 131072;
    c.tie_word_embeddings = true;
    return c;
  }
  if (name == "tiny") {
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.rope_scaling = Llama3RopeScaling{8.0, 1.0, 4.0, 64};
    c.max_position_embeddings = 2048;
    return c;
  }
  throw ConfigError(
      fmt::format("--model '{}': unknown preset (presets: llama3-8b, llama3.1-8b, llama3.2-1b, tiny; "
                  "or a directory with config.json and safetensors)",
                  name));
}

// ------------------------------------------------------------------ rotary
torch::Tensor llama_inv_freq(const LlamaConfig& c) {
  // fp32 arithmetic, as transformers computes it (the checkpoints were trained with those values).
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  torch::Tensor inv_freq = 1.0 / torch::pow(torch::tensor(c.rope_theta, f32),
                                            torch::arange(0, c.head_dim, 2, torch::kInt64).to(torch::kFloat32) /
                                                static_cast<double>(c.head_dim));
  if (!c.rope_scaling) return inv_freq;
  const auto& s = *c.rope_scaling;
  const double old_context = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  const torch::Tensor wavelen = 2 * M_PI / inv_freq;
  torch::Tensor scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  const torch::Tensor smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const torch::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  const torch::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return torch::where(medium, smoothed, scaled);
}

// ------------------------------------------------------------------ LoRA
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

LoraLinearImpl::LoraLinearImpl(std::int64_t in_features, std::int64_t out_features) {
  weight = register_parameter("weight", torch::empty({out_features, in_features}));
  nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
}

void LoraLinearImpl::enable_lora(std::int64_t rank, double alpha, double dropout_p) {
  const auto options = torch::TensorOptions().dtype(weight.scalar_type()).device(weight.device());
  lora_a = register_module("lora_A", nn::Linear(nn::LinearOptions(weight.size(1), rank).bias(false)));
  lora_b = register_module("lora_B", nn::Linear(nn::LinearOptions(rank, weight.size(0)).bias(false)));
  lora_a->to(options.device(), options.dtype().toScalarType());
  lora_b->to(options.device(), options.dtype().toScalarType());
  torch::NoGradGuard no_grad;
  lora_b->weight.zero_();  // the adapted model starts equal to the base model
  dropout = register_module("lora_dropout", nn::Dropout(dropout_p));
  scaling = alpha / static_cast<double>(rank);
  weight.set_requires_grad(false);
}

torch::Tensor LoraLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor out = torch::nn::functional::linear(x, weight);
  if (has_lora() && adapter_enabled) out = out + lora_b(lora_a(dropout(x))) * scaling;
  return out;
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

// ------------------------------------------------------------------ layers
LlamaRMSNormImpl::LlamaRMSNormImpl(std::int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor LlamaRMSNormImpl::forward(const torch::Tensor& x) {
  const torch::Tensor h = x.to(torch::kFloat32);
  const torch::Tensor normed = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * normed.to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c)
    : heads_(c.num_attention_heads), kv_heads_(c.num_key_value_heads), head_dim_(c.head_dim) {
  q_proj = register_module("q_proj", linear(c.hidden_size, heads_ * head_dim_));
  k_proj = register_module("k_proj", linear(c.hidden_size, kv_heads_ * head_dim_));
  v_proj = register_module("v_proj", linear(c.hidden_size, kv_heads_ * head_dim_));
  o_proj = register_module("o_proj", linear(heads_ * head_dim_, c.hidden_size));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const auto b = x.size(0);
  const auto t = x.size(1);
  auto heads = [&](const torch::Tensor& y, std::int64_t n) { return y.view({b, t, n, head_dim_}).transpose(1, 2); };
  torch::Tensor q = heads(q_proj(x), heads_);
  torch::Tensor k = heads(k_proj(x), kv_heads_);
  const torch::Tensor v = heads(v_proj(x), kv_heads_);
  q = q * cos + rotate_half(q) * sin;  // cos, sin broadcast over [B, H]
  k = k * cos + rotate_half(k) * sin;
  const torch::Tensor out = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                             /*is_causal=*/true, /*scale=*/std::nullopt,
                                                             /*enable_gqa=*/kv_heads_ != heads_);
  return o_proj(out.transpose(1, 2).reshape({b, t, heads_ * head_dim_}));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c) {
  gate_proj = register_module("gate_proj", linear(c.hidden_size, c.intermediate_size));
  up_proj = register_module("up_proj", linear(c.hidden_size, c.intermediate_size));
  down_proj = register_module("down_proj", linear(c.intermediate_size, c.hidden_size));
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c) {
  input_layernorm = register_module("input_layernorm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps));
  self_attn = register_module("self_attn", LlamaAttention(c));
  post_attention_layernorm = register_module("post_attention_layernorm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps));
  mlp = register_module("mlp", LlamaMLP(c));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                             const torch::Tensor& sin) {
  const torch::Tensor h = x + self_attn(input_layernorm(x), cos, sin);
  return h + mlp(post_attention_layernorm(h));
}

LlamaBodyImpl::LlamaBodyImpl(const LlamaConfig& c) {
  embed_tokens = register_module("embed_tokens", nn::Embedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", nn::ModuleList());
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(LlamaDecoderLayer(c));
  norm = register_module("norm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps));
}

// ------------------------------------------------------------------ model
LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& config) : config_(config) {
  config_.validate();
  model = register_module("model", LlamaBody(config_));
  if (!config_.tie_word_embeddings) {
    lm_head = register_module("lm_head", linear(config_.hidden_size, config_.vocab_size));
  }
  inv_freq_ = llama_inv_freq(config_);
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    if (p.key().find("norm") != std::string::npos) continue;  // RMSNorm weights stay ones
    p.value().normal_(0.0, 0.02);                             // transformers' initializer_range
  }
}

std::pair<torch::Tensor, torch::Tensor> LlamaForCausalLMImpl::rotary(std::int64_t length, torch::Dtype dtype,
                                                                     torch::Device device) {
  if (inv_freq_.device() != device) inv_freq_ = inv_freq_.to(device);
  const torch::Tensor positions = torch::arange(length, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  const torch::Tensor freqs = torch::outer(positions, inv_freq_);
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

torch::Tensor LlamaForCausalLMImpl::hidden_states(const torch::Tensor& tokens) {
  MGBENCH_REQUIRE(tokens.dim() == 2 && tokens.scalar_type() == torch::kInt64, std::invalid_argument,
                  "Llama forward: tokens must be int64 [B, T], got {} of {}", c10::toString(tokens.scalar_type()),
                  dims(tokens.sizes()));
  torch::Tensor h = model->embed_tokens(tokens);
  const auto [cos, sin] = rotary(tokens.size(1), h.scalar_type(), h.device());
  const bool checkpoint = checkpointing_ && is_training() && torch::GradMode::is_enabled();
  for (const auto& layer : *model->layers) {
    auto* decoder = layer->as<LlamaDecoderLayerImpl>();
    if (checkpoint) {
      // The input must require grad for backward to reach the layer (the embedding is frozen).
      if (!h.requires_grad()) h = h.detach().requires_grad_(true);
      h = CheckpointedLayer::apply(h, cos, sin, reinterpret_cast<std::int64_t>(decoder));
    } else {
      h = decoder->forward(h, cos, sin);
    }
  }
  return model->norm(h);
}

torch::Tensor LlamaForCausalLMImpl::output_weight() const {
  return config_.tie_word_embeddings ? model->embed_tokens->weight : lm_head->weight;
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& tokens) {
  return torch::nn::functional::linear(hidden_states(tokens), output_weight());
}

std::vector<torch::Tensor> LlamaForCausalLMImpl::apply_lora(const LoraOptions& options) {
  MGBENCH_REQUIRE(options.rank >= 1, ConfigError, "--lora-rank {}: expected >= 1", options.rank);
  MGBENCH_REQUIRE(options.alpha > 0, ConfigError, "--lora-alpha {}: expected > 0", options.alpha);
  MGBENCH_REQUIRE(options.dropout >= 0 && options.dropout < 1, ConfigError, "--lora-dropout {}: expected [0, 1)",
                  options.dropout);
  const auto targets = options.hf_targets();
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
                    dims(t.sizes()), dims(tensor.sizes()));
    tensor.copy_(t);
    unused.erase(name);
    ++loaded;
  }
  MGBENCH_REQUIRE(loaded > 0, DataError, "adapter '{}': the model has no LoRA adapters (apply_lora first)", path);
  MGBENCH_REQUIRE(unused.empty(), DataError, "adapter '{}': tensor '{}' is not an adapter of this model", path,
                  unused.empty() ? std::string() : *unused.begin());
}

void LlamaForCausalLMImpl::load_hf_checkpoint(const std::string& dir) {
  const SafetensorsCheckpoint checkpoint(dir);
  std::set<std::string> unused;
  for (const auto& name : checkpoint.names()) {
    if (name.find("rotary_emb.inv_freq") == std::string::npos) unused.insert(name);
  }
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    if (name.find(".lora_") != std::string::npos) continue;  // adapters are not part of a base checkpoint
    MGBENCH_REQUIRE(checkpoint.contains(name), DataError, "checkpoint '{}': tensor '{}' is missing", dir, name);
    const torch::Tensor t = checkpoint.tensor(name);
    MGBENCH_REQUIRE(t.sizes() == p.value().sizes(), DataError,
                    "checkpoint '{}': tensor '{}' in {} has shape {}, the model (config.json) expects {}", dir, name,
                    checkpoint.file_of(name), dims(t.sizes()), dims(p.value().sizes()));
    p.value().copy_(t);
    unused.erase(name);
  }
  // A tied checkpoint may still carry lm_head.weight (equal to the embedding): accept it.
  if (config_.tie_word_embeddings) unused.erase("lm_head.weight");
  MGBENCH_REQUIRE(unused.empty(), DataError, "checkpoint '{}': tensor '{}' in {} is not part of the model", dir,
                  unused.empty() ? std::string() : *unused.begin(),
                  unused.empty() ? std::string() : checkpoint.file_of(*unused.begin()));
}

}  // namespace mgbench::models
