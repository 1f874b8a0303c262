#include "models/llama.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "core/config.h"
#include "core/error.h"
#include "models/row_gradient.h"
#include "models/state_dict.h"

namespace mgbench::models {
namespace {

namespace nn = torch::nn;

LoraLinear linear(std::int64_t in, std::int64_t out, BaseWeights base = BaseWeights::kDense) {
  return LoraLinear(in, out, base);
}

/// HF's rotary embedding, x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1):
/// the same products as x * cos + cat(x2, x1) * cat(-sin1, sin2), and cat(x2, x1) is x's halves
/// swapped -- a flip of x viewed as [..., 2, D / 2] (one op and one backward node, where narrow,
/// narrow, neg and cat are four with their nodes, and roll is a narrow, a narrow and a cat on the
/// CPU). sin_signed: cat(-sin1, sin2), rotary()'s.
torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin_signed) {
  std::vector<std::int64_t> halves = x.sizes().vec();
  halves.back() /= 2;
  halves.insert(halves.end() - 1, 2);
  return x * cos + x.view(halves).flip(-2).view(x.sizes()) * sin_signed;
}

/// HF's LlamaRMSNorm as one autograd node: y = weight * (h * r).to(x's dtype), h = x in fp32 (in
/// float64 for a float64 x, which HF rounds to fp32), r = rsqrt(mean(h^2) + eps) over the last dimension. Backward,
/// with n = h r and gn = (g * weight) in fp32: gx = r (gn - n mean(gn n)), gw = sum of g * n.to(x's dtype) over the
/// leading dimensions -- the gradients of autograd's chain (pow, mean, add, rsqrt, mul, cast, mul:
/// seven nodes), from x and r alone: n is recomputed, not kept.
class RmsNorm : public torch::autograd::Function<RmsNorm> {
 public:
  /// eps: [] in statistics_dtype(x) on x's device (a tensor: ATen's CPU ops on a Scalar convert
  /// it to a tensor first, four more ops each).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& eps) {
    const torch::Tensor h = x.to(statistics_dtype(x));
    // mean(h^2) + eps as eps + (1 / C) sum(h^2): the mean is a sum and a division by a Scalar.
    const torch::Tensor r = at::add(eps, (h * h).sum(-1, /*keepdim=*/true), 1.0 / static_cast<double>(x.size(-1)));
    r.rsqrt_();
    ctx->save_for_backward({x, weight, r});
    return weight * (h * r).to(x.scalar_type());
  }

  /// The statistics' dtype: fp32, float64 for a float64 x.
  static torch::ScalarType statistics_dtype(const torch::Tensor& x) {
    return x.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &r = saved[2];
    const torch::Tensor& g = grad_outputs[0];
    const torch::Tensor n = x.to(statistics_dtype(x)) * r;
    torch::Tensor gx, gw;
    if (ctx->needs_input_grad(0)) {
      const torch::Tensor gn = (g * weight).to(statistics_dtype(x));
      const torch::Tensor n_dot = n * (gn * n).sum(-1, /*keepdim=*/true);
      gx = (at::sub(gn, n_dot, 1.0 / static_cast<double>(x.size(-1))) * r).to(x.scalar_type());
    }
    if (ctx->needs_input_grad(1)) {
      std::vector<std::int64_t> leading(static_cast<std::size_t>(x.dim() - 1));
      std::iota(leading.begin(), leading.end(), 0);
      gw = (g * n.to(x.scalar_type())).sum(leading);
    }
    return {gx, gw, torch::Tensor()};
  }
};

/// Reentrant activation checkpoint of one decoder layer (the scheme of torch.utils.checkpoint's
/// use_reentrant=True): forward runs the layer without a graph and saves its input; backward
/// recomputes it with a graph and back-propagates through that, accumulating the layer's
/// parameter gradients and returning the input's. Where the layer draws random numbers (LoRA
/// dropout) the RNG state is saved and restored, so dropout draws the same masks in the
/// recomputation; otherwise the generator is not touched (nor read: a CUDA graph's capture cannot).
class CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
 public:
  /// The generator dropout draws from for tensors on x's device.
  static torch::Generator generator_of(const torch::Tensor& x) {
    return at::globalContext().defaultGenerator(x.is_cuda() ? x.device() : torch::Device(torch::kCPU));
  }

  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, torch::Tensor cos,
                               torch::Tensor sin, std::int64_t layer_address, const PackedRuns* runs,
                               bool draws_random_numbers) {
    ctx->saved_data["layer"] = layer_address;
    if (runs != nullptr) {  // kept by value: the packing is the caller's, gone before backward
      ctx->saved_data["lengths"] = runs->lengths;
      ctx->saved_data["cu_seqlens"] = runs->cu_seqlens;
      ctx->saved_data["max_length"] = runs->max_length;
    }
    ctx->saved_data["cos"] = cos;
    ctx->saved_data["sin"] = sin;
    if (draws_random_numbers) ctx->saved_data["rng"] = generator_of(x).get_state();
    ctx->save_for_backward({x});
    auto* layer = reinterpret_cast<LlamaDecoderLayerImpl*>(layer_address);
    return layer->forward(x, cos, sin, runs);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto* layer = reinterpret_cast<LlamaDecoderLayerImpl*>(ctx->saved_data["layer"].toInt());
    const torch::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    std::optional<PackedRuns> runs;
    if (const auto lengths = ctx->saved_data.find("lengths"); lengths != ctx->saved_data.end()) {
      runs = PackedRuns{lengths->second.toIntVector(), ctx->saved_data["cu_seqlens"].toTensor(),
                        ctx->saved_data["max_length"].toInt()};
    }
    const auto rng = ctx->saved_data.find("rng");
    torch::Generator gen = generator_of(x);
    torch::Tensor current;
    if (rng != ctx->saved_data.end()) {
      current = gen.get_state();
      gen.set_state(rng->second.toTensor());
    }
    torch::Tensor out;
    {
      torch::AutoGradMode grad(true);
      out = layer->forward(x, ctx->saved_data["cos"].toTensor(), ctx->saved_data["sin"].toTensor(),
                           runs ? &*runs : nullptr);
    }
    if (current.defined()) gen.set_state(current);
    torch::autograd::backward({out}, {grad_outputs[0]});
    return {x.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

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

LlamaRMSNormImpl::LlamaRMSNormImpl(std::int64_t dim, double eps)
    : eps_(eps), eps_tensor_(torch::full({}, eps, torch::kFloat32)) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor LlamaRMSNormImpl::forward(const torch::Tensor& x) {
  if (x.is_cuda() && weight.scalar_type() == x.scalar_type()) {
    return at::rms_norm(x, {weight.size(0)}, weight, eps_);  // one fused kernel each way (_fused_rms_norm)
  }
  const auto options = torch::TensorOptions().dtype(RmsNorm::statistics_dtype(x)).device(x.device());
  if (!eps_tensor_.defined() || eps_tensor_.device() != x.device() || eps_tensor_.scalar_type() != options.dtype()) {
    eps_tensor_ = torch::full({}, eps_, options);
  }
  return RmsNorm::apply(x, weight, eps_tensor_);
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c, BaseWeights base)
    : heads_(c.num_attention_heads), kv_heads_(c.num_key_value_heads), head_dim_(c.head_dim) {
  q_proj = register_module("q_proj", linear(c.hidden_size, heads_ * head_dim_, base));
  k_proj = register_module("k_proj", linear(c.hidden_size, kv_heads_ * head_dim_, base));
  v_proj = register_module("v_proj", linear(c.hidden_size, kv_heads_ * head_dim_, base));
  o_proj = register_module("o_proj", linear(heads_ * head_dim_, c.hidden_size, base));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                          const PackedRuns* runs) {
  const auto b = x.size(0);
  const auto t = x.size(1);
  auto heads = [&](const torch::Tensor& y, std::int64_t n) { return y.view({b, t, n, head_dim_}).transpose(1, 2); };
  torch::Tensor q = heads(q_proj(x), heads_);
  torch::Tensor k = heads(k_proj(x), kv_heads_);
  const torch::Tensor v = heads(v_proj(x), kv_heads_);
  q = rotate(q, cos, sin);  // cos, sin broadcast over [B, H]
  k = rotate(k, cos, sin);
  const torch::Tensor out = causal_attention(q, k, v, runs);
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

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                             const PackedRuns* runs) {
  const torch::Tensor h = x + self_attn->forward(input_layernorm(x), cos, sin, runs);
  return h + mlp(post_attention_layernorm(h));
}

LlamaBodyImpl::LlamaBodyImpl(const LlamaConfig& c, BaseWeights base, const Place& place) {
  embed_tokens = register_module("embed_tokens", nn::Embedding(c.vocab_size, c.hidden_size));
  place("model.embed_tokens", *embed_tokens);
  layers = register_module("layers", nn::ModuleList());
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers->push_back(LlamaDecoderLayer(c, base));
    place(fmt::format("model.layers.{}", i), *layers[static_cast<std::size_t>(i)]);
  }
  norm = register_module("norm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps));
  place("model.norm", *norm);
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& config, BaseWeights base, torch::Device device,
                                           const LlamaBodyImpl::Place& placed, bool draw)
    : config_(config), base_(base), device_(device) {
  config_.validate();
  torch::NoGradGuard no_grad;
  model = register_module("model", LlamaBody(config_, base_, [&](const std::string& name, nn::Module& part) {
                            place(name, part, placed, draw);
                          }));
  if (!config_.tie_word_embeddings) {
    lm_head = register_module("lm_head", linear(config_.hidden_size, config_.vocab_size));
    place("lm_head", *lm_head, placed, draw);
  }
  inv_freq_ = llama_inv_freq(config_);
}

void LlamaForCausalLMImpl::place(const std::string& name, nn::Module& part, const LlamaBodyImpl::Place& placed,
                                 bool draw) {
  part.to(device_);
  if (!draw) {
    if (placed) placed(name, part);
    return;
  }
  // transformers' initializer_range, drawn part by part in registration order (the whole model's
  // order, as one loop over it drew them); NF4 projections quantised as they are drawn. RMSNorm
  // weights stay ones.
  for (const auto& item : part.named_modules(name)) {
    if (auto* embedding = item.value()->as<nn::EmbeddingImpl>()) {
      embedding->weight.normal_(0.0, 0.02);
    } else if (auto* layer = item.value()->as<LoraLinearImpl>()) {
      if (!layer->is_nf4()) {
        layer->weight.normal_(0.0, 0.02);
        continue;
      }
      try {
        layer->quantize_base(
            torch::empty({layer->out_features, layer->in_features}, torch::TensorOptions().device(device_))
                .normal_(0.0, 0.02));
      } catch (const std::invalid_argument& e) {
        throw ConfigError(fmt::format("NF4 base weights: {}: {}", item.key(), e.what()));
      }
    }
  }
  if (placed) placed(name, part);
}

std::pair<torch::Tensor, torch::Tensor> LlamaForCausalLMImpl::rotary(std::int64_t length, torch::Dtype dtype,
                                                                     torch::Device device,
                                                                     const torch::Tensor& position_ids) {
  if (inv_freq_.device() != device) inv_freq_ = inv_freq_.to(device);
  const torch::Tensor positions =
      position_ids.defined() ? position_ids.to(torch::kFloat32)
                             : torch::arange(length, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  const torch::Tensor freqs = torch::outer(positions, inv_freq_);
  const torch::Tensor sin = freqs.sin();
  return {torch::cat({freqs, freqs}, -1).cos().to(dtype), torch::cat({-sin, sin}, -1).to(dtype)};
}

torch::Tensor LlamaForCausalLMImpl::hidden_states(const torch::Tensor& tokens, const SequencePacking* packing) {
  MGBENCH_REQUIRE(tokens.dim() == 2 && tokens.scalar_type() == torch::kInt64, std::invalid_argument,
                  "Llama forward: tokens must be int64 [B, T], got {} of {}", c10::toString(tokens.scalar_type()),
                  shape_text(tokens.sizes()));
  const PackedRuns* runs = nullptr;
  torch::Tensor position_ids;
  if (packing != nullptr) {
    std::int64_t total = 0;
    for (const std::int64_t n : packing->runs.lengths) total += n;
    MGBENCH_REQUIRE(tokens.size(0) == 1 && total == tokens.size(1) && packing->position_ids.dim() == 1 &&
                        packing->position_ids.size(0) == total,
                    std::invalid_argument,
                    "Llama forward: packed sequences must be tokens [1, S] with lengths summing to S and "
                    "position_ids [S]; got tokens {}, lengths summing to {}, position_ids {}",
                    shape_text(tokens.sizes()), total, shape_text(packing->position_ids.sizes()));
    runs = &packing->runs;
    position_ids = packing->position_ids;
  }
  const torch::Tensor& embedding = model->embed_tokens->weight;
  // Handed over by rows where the hooks take it (FSDP, an untied embedding).
  RowGradientSink* embedding_gradient = hooks_ != nullptr ? hooks_->row_gradient_sink(0) : nullptr;
  torch::Tensor h = leave(0, embedding_lookup(enter(0, tokens), embedding, embedding_gradient));
  const auto [cos, sin] = rotary(tokens.size(1), h.scalar_type(), h.device(), position_ids);
  const bool checkpoint = checkpointing_ && is_training() && torch::GradMode::is_enabled();
  int unit = 1;
  for (const auto& layer : *model->layers) {
    auto* decoder = layer->as<LlamaDecoderLayerImpl>();
    h = enter(unit, h);
    if (checkpoint) {
      // The input must require grad for backward to reach the layer (the embedding is frozen).
      if (!h.requires_grad()) h = h.detach().requires_grad_(true);
      h = CheckpointedLayer::apply(h, cos, sin, reinterpret_cast<std::int64_t>(decoder), runs, lora_dropout_ > 0);
    } else {
      h = decoder->forward(h, cos, sin, runs);
    }
    h = leave(unit++, h);
  }
  return leave(unit, model->norm(enter(unit, h)));
}

torch::Tensor LlamaForCausalLMImpl::output_weight() const {
  if (config_.tie_word_embeddings) {
    enter(0, torch::Tensor());
    return model->embed_tokens->weight;
  }
  enter(static_cast<int>(config_.num_hidden_layers) + 2, torch::Tensor());
  return lm_head->weight;
}

LlamaForCausalLMImpl::OutputProjection LlamaForCausalLMImpl::output_projection(const torch::Tensor& hidden) const {
  if (config_.tie_word_embeddings) return {enter(0, hidden), model->embed_tokens->weight};
  const int unit = static_cast<int>(config_.num_hidden_layers) + 2;
  const torch::Tensor input = enter(unit, hidden);
  OutputProjection out{lm_head->base_input(input), lm_head->base_weight()};
  // Only the parameter's own gradient can be handed over by rows (a fake-quantised weight's passes
  // through its quantisation's backward first).
  if (hooks_ != nullptr && out.weight.is_same(lm_head->weight)) out.weight_gradient = hooks_->row_gradient_sink(unit);
  return out;
}

ParameterUnit LlamaForCausalLMImpl::part_unit(const std::string& name, const torch::nn::Module& part,
                                              bool reshard_after_forward) {
  const std::string prefix = name + ".";
  ParameterUnit unit{name, {}, {}, {}, reshard_after_forward};
  for (const auto& item : part.named_parameters()) {
    unit.names.push_back(prefix + item.key());
    unit.parameters.push_back(item.value());
  }
  // NF4 base weights (QLoRA): not parameters, sharded packed in whole quantisation-factor blocks.
  for (const auto& item : part.named_modules()) {
    const auto* layer = item.value()->as<LoraLinearImpl>();
    if (layer == nullptr || !layer->is_nf4()) continue;
    const Nf4Weight& w = layer->nf4;
    unit.packed.push_back({prefix + (item.key().empty() ? "" : item.key() + ".") + "weight",
                           w.shape(),
                           {w.quantized_data(), w.quantized_scalers(), w.quantization_factor()},
                           w.quantization_factor().numel()});
  }
  return unit;
}

std::vector<ParameterUnit> LlamaForCausalLMImpl::parameter_units() {
  const bool tied = config_.tie_word_embeddings;
  std::vector<ParameterUnit> units;
  units.push_back(part_unit("model.embed_tokens", *model->embed_tokens, /*reshard_after_forward=*/!tied));
  units.back().backward_reads_parameters = tied;  // tied: the output head's backward reads it
  units.back().forward_uses = tied ? 2 : 1;
  units.back().gradient_by_rows = !tied;  // embedding_lookup hands it over by rows
  for (std::size_t i = 0; i < model->layers->size(); ++i) {
    units.push_back(part_unit(fmt::format("model.layers.{}", i), *model->layers[i]));
  }
  units.push_back(part_unit("model.norm", *model->norm, false));
  units.back().name = "root";
  if (!tied) {
    units.push_back(part_unit("lm_head", *lm_head, false));
    units.back().gradient_by_rows = true;  // target_log_probs hands it over by rows (output_projection)
    units.back().gradient_whole_at_times = lm_head->has_fake_quant();
  }
  return units;
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& tokens) {
  const OutputProjection head = output_projection(hidden_states(tokens));
  return torch::nn::functional::linear(head.input, head.weight);  // the gradient whole: no sink
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

}  // namespace mgbench::models
