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
#include "models/fake_quant.h"
#include "models/json_file.h"
#include "models/safetensors.h"

namespace mgbench::models {
namespace {

namespace nn = torch::nn;

LoraLinear linear(std::int64_t in, std::int64_t out, BaseWeights base = BaseWeights::kDense) {
  return LoraLinear(in, out, base);
}

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

std::string LlamaConfig::to_hf_json(torch::ScalarType dtype) const {
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
                   {"torch_dtype", dtype == torch::kBFloat16  ? "bfloat16"
                                   : dtype == torch::kFloat16 ? "float16"
                                   : dtype == torch::kFloat64 ? "float64"
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
                  std::invalid_argument, "quantize_base: a weight of shape {}, expected [{}, {}]", dims(dense.sizes()),
                  out_features, in_features);
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
  if (has_lora() && adapter_enabled) out = out + lora_b(lora_a(dropout(x))) * scaling;
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

// ------------------------------------------------------------------ layers
LlamaRMSNormImpl::LlamaRMSNormImpl(std::int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor LlamaRMSNormImpl::forward(const torch::Tensor& x) {
  const torch::Tensor h = x.to(torch::kFloat32);
  const torch::Tensor normed = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * normed.to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c, BaseWeights base)
    : heads_(c.num_attention_heads), kv_heads_(c.num_key_value_heads), head_dim_(c.head_dim) {
  q_proj = register_module("q_proj", linear(c.hidden_size, heads_ * head_dim_, base));
  k_proj = register_module("k_proj", linear(c.hidden_size, kv_heads_ * head_dim_, base));
  v_proj = register_module("v_proj", linear(c.hidden_size, kv_heads_ * head_dim_, base));
  o_proj = register_module("o_proj", linear(heads_ * head_dim_, c.hidden_size, base));
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

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c, BaseWeights base) {
  gate_proj = register_module("gate_proj", linear(c.hidden_size, c.intermediate_size, base));
  up_proj = register_module("up_proj", linear(c.hidden_size, c.intermediate_size, base));
  down_proj = register_module("down_proj", linear(c.intermediate_size, c.hidden_size, base));
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c, BaseWeights base) {
  input_layernorm = register_module("input_layernorm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps));
  self_attn = register_module("self_attn", LlamaAttention(c, base));
  post_attention_layernorm = register_module("post_attention_layernorm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps));
  mlp = register_module("mlp", LlamaMLP(c, base));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                             const torch::Tensor& sin) {
  const torch::Tensor h = x + self_attn(input_layernorm(x), cos, sin);
  return h + mlp(post_attention_layernorm(h));
}

LlamaBodyImpl::LlamaBodyImpl(const LlamaConfig& c, BaseWeights base) {
  embed_tokens = register_module("embed_tokens", nn::Embedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", nn::ModuleList());
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(LlamaDecoderLayer(c, base));
  norm = register_module("norm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps));
}

// ------------------------------------------------------------------ model
LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& config, BaseWeights base, torch::Device quantize_device)
    : config_(config), base_(base), quantize_device_(quantize_device) {
  config_.validate();
  model = register_module("model", LlamaBody(config_, base_));
  if (!config_.tie_word_embeddings) {
    lm_head = register_module("lm_head", linear(config_.hidden_size, config_.vocab_size));
  }
  inv_freq_ = llama_inv_freq(config_);
  // transformers' initializer_range, drawn module by module in registration order; NF4
  // projections quantised as they are drawn. RMSNorm weights stay ones.
  torch::NoGradGuard no_grad;
  for (const auto& item : named_modules("", /*include_self=*/false)) {
    if (auto* embedding = item.value()->as<nn::EmbeddingImpl>()) {
      embedding->weight.normal_(0.0, 0.02);
    } else if (auto* layer = item.value()->as<LoraLinearImpl>()) {
      if (!layer->is_nf4()) {
        layer->weight.normal_(0.0, 0.02);
        continue;
      }
      try {
        layer->quantize_base(
            torch::empty({layer->out_features, layer->in_features}).normal_(0.0, 0.02).to(quantize_device_));
      } catch (const std::invalid_argument& e) {
        throw ConfigError(fmt::format("NF4 base weights: {}: {}", item.key(), e.what()));
      }
    }
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

std::pair<torch::Tensor, torch::Tensor> LlamaForCausalLMImpl::output_projection(const torch::Tensor& hidden) const {
  if (config_.tie_word_embeddings) return {hidden, model->embed_tokens->weight};
  return {lm_head->base_input(hidden), lm_head->base_weight()};
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& tokens) {
  const auto [input, weight] = output_projection(hidden_states(tokens));
  return torch::nn::functional::linear(input, weight);
}

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

std::int64_t LlamaForCausalLMImpl::weight_nbytes() const {
  std::int64_t bytes = 0;
  for (const auto& item : named_parameters()) {
    if (item.key().find(".lora_") == std::string::npos) bytes += static_cast<std::int64_t>(item.value().nbytes());
  }
  for (const auto& module : modules(/*include_self=*/false)) {
    if (const auto* layer = module->as<LoraLinearImpl>(); layer != nullptr && layer->is_nf4()) {
      bytes += layer->nf4.nbytes();
    }
  }
  return bytes;
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
                    name, checkpoint.file_of(name), dims(t.sizes()), layer->out_features, layer->in_features);
    require_finite(t, dir, name, checkpoint.file_of(name));
    try {
      layer->quantize_base(t.to(quantize_device_));
    } catch (const std::invalid_argument& e) {
      throw DataError(fmt::format("checkpoint '{}': tensor '{}': {}", dir, name, e.what()));
    }
    unused.erase(name);
  }
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    if (name.find(".lora_") != std::string::npos) continue;  // adapters are not part of a base checkpoint
    MGBENCH_REQUIRE(checkpoint.contains(name), DataError, "checkpoint '{}': tensor '{}' is missing", dir, name);
    const torch::Tensor t = checkpoint.tensor(name);
    MGBENCH_REQUIRE(t.sizes() == p.value().sizes(), DataError,
                    "checkpoint '{}': tensor '{}' in {} has shape {}, the model (config.json) expects {}", dir, name,
                    checkpoint.file_of(name), dims(t.sizes()), dims(p.value().sizes()));
    require_finite(t, dir, name, checkpoint.file_of(name));
    p.value().copy_(t);
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
