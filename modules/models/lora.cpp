#include "models/lora.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "models/fake_quant.h"
#include "models/json_file.h"
#include "models/state_dict.h"

namespace mgbench::models {
namespace {

namespace nn = torch::nn;
using torch::Tensor;

/// t in dtype: itself when it already is one (no dispatched op).
Tensor in_dtype(const Tensor& t, torch::ScalarType dtype) { return t.scalar_type() == dtype ? t : t.to(dtype); }

/// m^T of a 2-D m as one as_strided op (t() dispatches t, transpose and as_strided: three host
/// round trips for the same view, and a projection takes five such views a step).
Tensor transposed(const Tensor& m) {
  return m.as_strided({m.size(1), m.size(0)}, {m.stride(1), m.stride(0)}, m.storage_offset());
}

/// t [..., C] as [N, C]: one view op where t is contiguous (reshape dispatches reshape and view).
Tensor rows(const Tensor& t) { return t.is_contiguous() ? t.view({-1, t.size(-1)}) : t.reshape({-1, t.size(-1)}); }

/// y = x W^T + (s xa A^T) B^T as one autograd node (LoraLinearImpl's forward). A chain of
/// nn::Linear layers costs autograd a matmul's reshape, mm and view nodes per product, a scale node
/// and an add node; this node's forward is three GEMMs on 2-D views, the adapter folded into the
/// base output by addmm, and its backward the GEMMs of the gradients that are needed, no more.
/// Tensor arguments, by autograd's input index: 0 x (the base input, [..., in]), 1 xa (the
/// adapter's input when it is not x: dropout(x) with fake quantisation or dropout; else undefined),
/// 2 weight (the dense base [out, in]; undefined with nf4), 3 A [r, in], 4 B [out, r] (undefined:
/// no adapter). nf4: the NF4 base, dequantised in forward and again in backward, so that only the
/// packed weight is kept (torchao's LinearNF4).
class Projection : public torch::autograd::Function<Projection> {
 public:
  /// The optional tensors are passed as std::optional (autograd takes an undefined Tensor for an
  /// input with a device), so their autograd input indices are those of the present ones.
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x, const std::optional<Tensor>& xa_arg,
                        const std::optional<Tensor>& weight_arg, const std::optional<Tensor>& lora_a_arg,
                        const std::optional<Tensor>& lora_b_arg, double scaling, const Nf4Weight* nf4) {
    const Tensor xa = xa_arg.value_or(Tensor()), weight = weight_arg.value_or(Tensor());
    const Tensor lora_a = lora_a_arg.value_or(Tensor()), lora_b = lora_b_arg.value_or(Tensor());
    std::vector<std::int64_t> edges{0};  // per tensor argument, its autograd input index (-1: absent)
    for (const Tensor* t : {&xa, &weight, &lora_a, &lora_b}) {
      edges.push_back(t->defined() ? *std::max_element(edges.begin(), edges.end()) + 1 : -1);
    }
    ctx->saved_data["edges"] = edges;
    const Tensor x2 = rows(x);
    const bool adapter = lora_a.defined();
    const Tensor xa2 = adapter && xa.defined() ? rows(xa) : x2;
    const Tensor w = nf4 != nullptr ? nf4->dequantize().to(x.scalar_type()) : weight;
    Tensor y, low;  // low: xa A^T [N, r]
    if (adapter) {
      // The scaling as the GEMMs' alpha: no op of its own, forward or backward.
      low = at::mm(xa2, transposed(lora_a));
      y = at::addmm(at::mm(x2, transposed(w)), low, transposed(lora_b), /*beta=*/1, /*alpha=*/scaling);
    } else {
      y = at::mm(x2, transposed(w));
    }
    // What backward reads, as autograd's mm saves it: an operand only where a gradient needs it.
    const bool grad_x = x.requires_grad(), grad_w = weight.defined() && weight.requires_grad();
    const bool grad_a = adapter && lora_a.requires_grad(), grad_b = adapter && lora_b.requires_grad();
    const bool grad_xa = adapter && xa.defined() && xa.requires_grad();
    ctx->save_for_backward({grad_w || (grad_a && !xa.defined()) ? x : Tensor(), grad_a && xa.defined() ? xa : Tensor(),
                            grad_x && nf4 == nullptr ? weight : Tensor(),
                            grad_x || grad_xa || grad_a ? lora_a : Tensor(), adapter ? lora_b : Tensor(),
                            grad_b ? low : Tensor()});
    ctx->saved_data["scaling"] = scaling;
    ctx->saved_data["adapter_reads_x"] = adapter && !xa.defined();
    if (nf4 != nullptr && grad_x) {
      ctx->saved_data["nf4_data"] = nf4->quantized_data();
      ctx->saved_data["nf4_scalers"] = nf4->quantized_scalers();
      ctx->saved_data["nf4_factor"] = nf4->quantization_factor();
      ctx->saved_data["nf4_mean"] = nf4->scaler_mean();
      ctx->saved_data["nf4_shape"] = nf4->shape();
      ctx->saved_data["nf4_dtype"] = static_cast<std::int64_t>(nf4->dtype());
    }
    return y.view(with_features(x, y.size(1)));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &xa = saved[1], &weight = saved[2], &lora_b = saved[4], &low = saved[5];
    const double s = ctx->saved_data["scaling"].toDouble();
    const Tensor& g = grad_outputs[0];
    const torch::ScalarType dtype = g.scalar_type();  // the forward's compute dtype (autocast's, if on)
    const Tensor g2 = rows(g);
    const auto flat = [dtype](const Tensor& t) { return in_dtype(rows(t), dtype); };
    const std::vector<std::int64_t> edges = ctx->saved_data["edges"].toIntVector();
    const auto needs = [&](std::size_t i) { return edges[i] >= 0 && ctx->needs_input_grad(edges[i]); };
    const bool adapter = lora_b.defined();
    const Tensor lora_a = saved[3].defined() ? in_dtype(saved[3], dtype) : Tensor();
    // The scaling as alpha again; with beta 0 the GEMMs' `self` (a tensor of the result's shape) is
    // not read.
    Tensor gx, gxa, gw, ga, gb, g_b;  // g_b: g B [N, r]; the gradient of xa A^T is s g_b
    if (adapter) {
      const Tensor b = in_dtype(lora_b, dtype);
      g_b = at::mm(g2, b);
      if (needs(4)) gb = at::addmm(b, transposed(g2), low, /*beta=*/0, /*alpha=*/s);
      if (needs(3)) ga = at::addmm(lora_a, transposed(g_b), flat(xa.defined() ? xa : x), /*beta=*/0, /*alpha=*/s);
      if (needs(1)) {
        gxa = at::mm(g_b, lora_a).mul_(s);
        gxa = gxa.view(with_features(g, gxa.size(1)));
      }
    }
    if (needs(0)) {
      const Tensor w = weight.defined() ? in_dtype(weight, dtype) : saved_nf4(ctx).dequantize().to(dtype);
      gx = at::mm(g2, w);
      // The adapter's share when its input is x itself: into the same product's output.
      if (ctx->saved_data["adapter_reads_x"].toBool()) gx.addmm_(g_b, lora_a, /*beta=*/1, /*alpha=*/s);
      gx = gx.view(with_features(g, gx.size(1)));
    }
    if (needs(2)) gw = at::mm(transposed(g2), flat(x));
    return {gx, gxa, gw, ga, gb, Tensor(), Tensor()};
  }

 private:
  /// t's sizes with `features` last: the output's from the input's and the input's from the
  /// output gradient's.
  static std::vector<std::int64_t> with_features(const Tensor& t, std::int64_t features) {
    std::vector<std::int64_t> shape = t.sizes().vec();
    shape.back() = features;
    return shape;
  }

  static Nf4Weight saved_nf4(torch::autograd::AutogradContext* ctx) {
    auto& s = ctx->saved_data;
    return Nf4Weight::from_parts(s["nf4_data"].toTensor(), s["nf4_scalers"].toTensor(), s["nf4_factor"].toTensor(),
                                 s["nf4_mean"].toTensor(), s["nf4_shape"].toIntVector(),
                                 static_cast<torch::ScalarType>(s["nf4_dtype"].toInt()));
  }
};

}  // namespace

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
                  std::invalid_argument, "quantize_base: a weight of shape {}, expected [{}, {}]",
                  shape_text(dense.sizes()), out_features, in_features);
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
  MGBENCH_REQUIRE(x.dim() >= 1 && x.size(-1) == in_features, std::invalid_argument,
                  "LoraLinear: input {} does not end in the layer's {} in-features", shape_text(x.sizes()),
                  in_features);
  const torch::Tensor base_x = is_nf4() ? x : base_input(x);
  const bool adapter = has_lora() && adapter_enabled;
  torch::Tensor adapter_x;  // undefined: the adapter reads base_x
  if (adapter) {
    const torch::Tensor dropped = dropout->options.p() > 0 ? dropout(x) : x;
    if (!dropped.is_same(base_x)) adapter_x = dropped;
  }
  using Optional = std::optional<torch::Tensor>;
  return Projection::apply(base_x, adapter_x.defined() ? Optional(adapter_x) : std::nullopt,
                           is_nf4() ? std::nullopt : Optional(base_weight()),
                           adapter ? Optional(lora_a->weight) : std::nullopt,
                           adapter ? Optional(lora_b->weight) : std::nullopt, scaling, is_nf4() ? &nf4 : nullptr);
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

LoraOptions read_adapter_config(const std::string& adapter_dir) {
  const std::string path = (std::filesystem::path(adapter_dir) / "adapter_config.json").string();
  const nlohmann::json config = read_json_file(path, "adapter configuration");
  MGBENCH_REQUIRE(config.is_object(), DataError, "'{}': expected a JSON object (PEFT's adapter_config.json)", path);
  for (const char* key : {"use_rslora", "use_dora"}) {
    MGBENCH_REQUIRE(!config.contains(key) || !config[key].is_boolean() || !config[key].get<bool>(), ConfigError,
                    "'{}' has \"{}\": true, which mgbench's LoRA does not compute", path, key);
  }
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    MGBENCH_REQUIRE(!config.contains(key) || config[key].is_null() || config[key].empty(), ConfigError,
                    "'{}' has a per-module \"{}\", which mgbench's LoRA does not take", path, key);
  }
  LoraOptions lora;
  lora.dropout = 0.0;
  const std::string expected =
      "expected PEFT's \"r\" (a whole number >= 1), \"lora_alpha\" (a number above 0) and \"target_modules\" (a "
      "list of module names)";
  try {
    lora.rank = json_integer(config.at("r"));
    const nlohmann::json& alpha = config.at("lora_alpha");
    MGBENCH_REQUIRE(alpha.is_number(), DataError, "'{}': \"lora_alpha\" {}: {}", path, alpha.dump(), expected);
    lora.alpha = alpha.get<double>();
    lora.targets = config.at("target_modules").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("'{}': {} ({})", path, expected, e.what()));
  }
  MGBENCH_REQUIRE(lora.rank >= 1 && lora.alpha > 0 && std::isfinite(lora.alpha), DataError,
                  "'{}': \"r\" {}, \"lora_alpha\" {:g}: {}", path, lora.rank, lora.alpha, expected);
  return lora;
}

}  // namespace mgbench::models
