// Quantised fine-tuning's pieces, bitwise against torchao 0.11 and TorchTune 0.6.1 (the LoRA
// layers' outputs within bf16's rounding bound beside TorchTune's: equal_within_rounding)
// (tests/python/quant_oracles.py): NF4 quantisation and dequantisation, the QLoRA linear,
// 8da4w fake quantisation with its straight-through gradients, the int4 convert, QAT-LoRA.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include "core/error.h"
#include "host_bytes.h"
#include "models/fake_quant.h"
#include "models/llama.h"
#include "models/nf4.h"
#include "models/state_dict.h"
#include "test_support.h"

namespace mgbench {
namespace {

using models::LoraLinear;
using models::Nf4Weight;

const std::map<std::string, torch::Tensor>& oracle() {
  static const std::map<std::string, torch::Tensor> tensors = [] {
    const std::string path = test::oracle_dir() + "/quant_oracles.pt";
    return std::filesystem::exists(path) ? models::read_torch_state_dict(path) : std::map<std::string, torch::Tensor>{};
  }();
  return tensors;
}

#define SKIP_WITHOUT_QUANT_ORACLE() MGBENCH_REQUIRE_INPUTS(test::oracle_dir() + "/quant_oracles.pt")

const torch::Tensor& at(const std::string& key) {
  const auto it = oracle().find(key);
  if (it == oracle().end()) throw std::out_of_range("oracle tensor " + key);
  return it->second;
}

/// Same dtype, shape and bits.
::testing::AssertionResult bitwise_equal(const torch::Tensor& ours, const torch::Tensor& theirs) {
  if (ours.scalar_type() != theirs.scalar_type() || ours.sizes() != theirs.sizes()) {
    return ::testing::AssertionFailure() << c10::toString(ours.scalar_type()) << ours.sizes() << " vs "
                                         << c10::toString(theirs.scalar_type()) << theirs.sizes();
  }
  if (torch::equal(ours, theirs)) return ::testing::AssertionSuccess();
  const torch::Tensor differ = ours.ne(theirs);
  return ::testing::AssertionFailure()
         << differ.sum().item<std::int64_t>() << " of " << ours.numel() << " elements differ; max |diff| "
         << (ours.to(torch::kFloat64) - theirs.to(torch::kFloat64)).abs().max().item<double>();
}

TEST(Nf4, PackedDataScalersFactorsMeanAndDequantisedWeightBitwiseEqualTorchao) {
  SKIP_WITHOUT_QUANT_ORACLE();
  int cases = 0;
  for (const char* weight : {"normal_128x128", "uniform_256x512", "ties_64x256", "stories260k_embedding"}) {
    for (const char* dtype : {"bfloat16", "float16", "float32"}) {
      const std::string key = std::string("nf4.") + weight + "." + dtype;
      SCOPED_TRACE(key);
      const Nf4Weight nf4 = Nf4Weight::quantize(at(key + ".weight"));
      EXPECT_TRUE(bitwise_equal(nf4.quantized_data(), at(key + ".quantized_data")));
      EXPECT_TRUE(bitwise_equal(nf4.quantized_scalers(), at(key + ".quantized_scalers")));
      EXPECT_TRUE(bitwise_equal(nf4.quantization_factor(), at(key + ".quantization_factor")));
      EXPECT_TRUE(bitwise_equal(nf4.scaler_mean().reshape({1}), at(key + ".scaler_mean")));
      EXPECT_TRUE(bitwise_equal(nf4.dequantize(), at(key + ".dequantized")));
      // Rebuilt from its parts (a saved graph), it dequantises the same.
      const Nf4Weight again =
          Nf4Weight::from_parts(nf4.quantized_data(), nf4.quantized_scalers(), nf4.quantization_factor(),
                                nf4.scaler_mean(), nf4.shape(), nf4.dtype());
      EXPECT_TRUE(bitwise_equal(again.dequantize(), at(key + ".dequantized")));
      ++cases;
    }
  }
  EXPECT_EQ(cases, 12);
}

// The code tables are built once per (dtype, device) and then handed out as they are: a layer call
// makes no host-built table and no host -> device copy (on a GPU: no stream synchronisation per NF4
// linear; issue 32). And they hold torchao's values, the pairs each byte's two nibbles'.
TEST(Nf4, CodeTablesAreBuiltOncePerDtypeAndDevice) {
  const torch::Tensor codes = models::nf4_codes(torch::kBFloat16, torch::kCPU);
  EXPECT_EQ(models::nf4_codes(torch::kBFloat16, torch::kCPU).data_ptr(), codes.data_ptr());
  EXPECT_NE(models::nf4_codes(torch::kFloat32, torch::kCPU).data_ptr(), codes.data_ptr());
  const torch::Tensor pairs = models::nf4_code_pairs(torch::kFloat32, torch::kCPU);
  EXPECT_EQ(models::nf4_code_pairs(torch::kFloat32, torch::kCPU).data_ptr(), pairs.data_ptr());
  ASSERT_EQ(pairs.sizes(), (std::vector<std::int64_t>{256, 2}));
  const torch::Tensor c32 = models::nf4_codes(torch::kFloat32, torch::kCPU);
  EXPECT_EQ(c32[0].item<float>(), -1.0F);
  EXPECT_EQ(c32[15].item<float>(), 1.0F);
  EXPECT_EQ(pairs[0x7F][0].item<float>(), c32[7].item<float>());
  EXPECT_EQ(pairs[0x7F][1].item<float>(), c32[15].item<float>());
  // Dequantising twice gives the same weight (the shared tables are not written).
  const Nf4Weight nf4 = Nf4Weight::quantize(torch::randn({128, 128}));
  EXPECT_TRUE(torch::equal(nf4.dequantize(), nf4.dequantize()));
}

TEST(Nf4, BytesPerParameterAndErrors) {
  const torch::Tensor w = torch::randn({256, 512}, torch::kBFloat16);
  const Nf4Weight nf4 = Nf4Weight::quantize(w);
  // 4 bits + one int8 scaler per 64 + one bf16 factor per 16384, + the mean.
  EXPECT_EQ(nf4.nbytes(), w.numel() / 2 + w.numel() / 64 + 2 * (w.numel() / 16384) + 2);
  EXPECT_LE(static_cast<double>(nf4.nbytes()) / static_cast<double>(w.nbytes()), 0.30);
  EXPECT_EQ(nf4.shape(), (std::vector<std::int64_t>{256, 512}));
  test::expect_error<std::invalid_argument>(
      [] {
        Nf4Weight::quantize(torch::randn({64, 64}));
      },
      {"[64, 64]", "4096", "16384"});
  test::expect_error<std::invalid_argument>(
      [] {
        Nf4Weight::quantize(torch::randn({128, 128}, torch::kFloat64));
      },
      {"Double", "bf16"});
  test::expect_error<std::invalid_argument>([] { Nf4Weight::quantize(torch::randn({2, 128, 128})); }, {"2-D"});
}

/// A LoRA product  out = L1 R1 + s (L2 M) R2  (the base product plus the scaled adapter product) as
/// bf16 GEMMs compute it: each GEMM accumulates in fp32 and rounds its output to bf16 (unit roundoff
/// u = 2^-8). mgbench adds the adapter's product into the base product's output (addmm: the sum
/// rounded once); TorchTune rounds the adapter's product, then the sum. Both are held to the
/// first-order rounding-error bound of their own sequence, element by element (Higham, Accuracy and
/// Stability of Numerical Algorithms, 2nd ed., sections 2.2 and 3.5), against the exact value in
/// float64. A bound, not a comparison of the two errors: which of two correctly rounded results lies
/// nearer the exact value is a matter of the last bit and changed with the CPU's GEMM kernels (Intel
/// AVX-512 BF16 vs AMD EPYC), so "ours no further than theirs" failed on one machine and not another.
struct LoraProduct {
  torch::Tensor base_left, base_right, adapter_left, adapter_mid, adapter_right;
  double scaling = 1.0;
};

::testing::AssertionResult within_rounding(const char* what, const torch::Tensor& result, const torch::Tensor& exact,
                                           const torch::Tensor& bound) {
  const torch::Tensor ratio = (result.to(torch::kFloat64) - exact).abs() / bound;
  const double worst = ratio.max().item<double>();
  if (worst <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": an element " << worst << " times its rounding bound ("
                                       << ratio.gt(1.0).sum().item<std::int64_t>() << " of " << ratio.numel()
                                       << " elements past it)";
}

::testing::AssertionResult equal_within_rounding(const torch::Tensor& ours, const torch::Tensor& theirs,
                                                 const LoraProduct& p) {
  if (ours.scalar_type() != torch::kBFloat16 || theirs.scalar_type() != torch::kBFloat16 ||
      ours.sizes() != theirs.sizes()) {
    return ::testing::AssertionFailure() << c10::toString(ours.scalar_type()) << ours.sizes() << " vs "
                                         << c10::toString(theirs.scalar_type()) << theirs.sizes();
  }
  const auto f64 = [](const torch::Tensor& t) { return t.to(torch::kFloat64); };
  const auto abs64 = [&](const torch::Tensor& t) { return f64(t).abs(); };
  const double u = std::ldexp(1.0, -8), fp32_u = std::ldexp(1.0, -24), s = p.scaling;
  const torch::Tensor base = torch::matmul(f64(p.base_left), f64(p.base_right));
  const torch::Tensor inner = torch::matmul(f64(p.adapter_left), f64(p.adapter_mid));
  const torch::Tensor exact = base + s * torch::matmul(inner, f64(p.adapter_right));
  const torch::Tensor adapter_magnitude = s * torch::matmul(inner.abs(), abs64(p.adapter_right));
  // fp32 accumulation of each GEMM (inner dimension k: gamma_k = k 2^-24 times the sum of |terms|).
  const auto k_base = static_cast<double>(p.base_right.size(0));
  const auto k_inner = static_cast<double>(p.adapter_mid.size(0));
  const auto k_rank = static_cast<double>(p.adapter_right.size(0)) + 1.0;
  const torch::Tensor accumulation =
      fp32_u *
      (k_base * torch::matmul(abs64(p.base_left), abs64(p.base_right)) +
       s * k_inner * torch::matmul(torch::matmul(abs64(p.adapter_left), abs64(p.adapter_mid)), abs64(p.adapter_right)) +
       k_rank * adapter_magnitude);
  // The base output, the adapter's inner product and the result each rounded once (1 + 4u: the
  // second-order terms); TorchTune's adapter product once more.
  const torch::Tensor ours_bound =
      (1.0 + 4.0 * u) * (u * (exact.abs() + base.abs() + adapter_magnitude) + accumulation);
  const torch::Tensor theirs_bound = ours_bound + (1.0 + 4.0 * u) * u * adapter_magnitude;
  ::testing::AssertionResult ok = within_rounding("mgbench", ours, exact, ours_bound);
  if (!ok) return ok;
  return within_rounding("TorchTune", theirs, exact, theirs_bound);
}

/// A LoraLinear with the oracle's base weight and adapters.
LoraLinear lora_layer(const std::string& prefix, std::int64_t in, std::int64_t out, std::int64_t rank, double alpha,
                      models::BaseWeights base) {
  LoraLinear layer = [&] {
    const test::DefaultDtype bf16(torch::kBFloat16);
    return LoraLinear(in, out, base);
  }();
  if (base == models::BaseWeights::kNf4) {
    layer->quantize_base(at(prefix + ".weight"));
  } else {
    torch::NoGradGuard no_grad;
    layer->weight.copy_(at(prefix + ".weight"));
  }
  layer->enable_lora(rank, alpha, 0.0);
  torch::NoGradGuard no_grad;
  layer->lora_a->weight.copy_(at(prefix + ".lora_a"));
  layer->lora_b->weight.copy_(at(prefix + ".lora_b"));
  return layer;
}

// The adapters' gradients bitwise; the output and the input's gradient, where mgbench adds the
// adapter's product into the base product's output, each within its rounding bound beside TorchTune's
// (equal_within_rounding).
TEST(QloraLinear, ForwardDisabledAdaptersAndGradientsEqualTorchTune) {
  SKIP_WITHOUT_QUANT_ORACLE();
  LoraLinear layer = lora_layer("qlora", 256, 128, 8, 16.0, models::BaseWeights::kNf4);
  EXPECT_FALSE(layer->weight.defined());  // no dense copy of the base
  const torch::Tensor x = at("qlora.x").clone().requires_grad_(true);
  const torch::Tensor y = layer->forward(x);
  const torch::Tensor w = layer->nf4.dequantize(), a = at("qlora.lora_a"), b = at("qlora.lora_b");
  EXPECT_TRUE(
      equal_within_rounding(y.detach(), at("qlora.y"), {at("qlora.x"), w.t(), at("qlora.x"), a.t(), b.t(), 2.0}));
  y.backward(at("qlora.grad_y"));
  const torch::Tensor& g = at("qlora.grad_y");
  EXPECT_TRUE(equal_within_rounding(x.grad(), at("qlora.grad_x"), {g, w, g, b, a, 2.0}));
  EXPECT_TRUE(bitwise_equal(layer->lora_a->weight.grad(), at("qlora.grad_lora_a")));
  EXPECT_TRUE(bitwise_equal(layer->lora_b->weight.grad(), at("qlora.grad_lora_b")));
  layer->adapter_enabled = false;
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(bitwise_equal(layer->forward(at("qlora.x")), at("qlora.y_disabled")));
}

TEST(FakeQuant8da4w, ActivationsWeightsOutputsAndGradientsBitwiseEqualTorchao) {
  SKIP_WITHOUT_QUANT_ORACLE();
  int cases = 0;
  for (const char* group : {"256", "32"}) {
    for (const char* dtype : {"bfloat16", "float32"}) {
      const std::string key = std::string("qat.g") + group + "." + dtype;
      SCOPED_TRACE(key);
      const std::int64_t g = std::stoll(group);
      EXPECT_TRUE(bitwise_equal(models::fake_quantize_per_token_int8(at(key + ".x")), at(key + ".x_fq")));
      EXPECT_TRUE(bitwise_equal(models::fake_quantize_per_group_int4(at(key + ".weight"), g), at(key + ".weight_fq")));

      LoraLinear layer = [&] {
        const test::DefaultDtype weight_dtype(at(key + ".weight").scalar_type());
        return LoraLinear(512, 64);
      }();
      {
        torch::NoGradGuard no_grad;
        layer->weight.copy_(at(key + ".weight"));
      }
      layer->enable_fake_quant(g);
      const torch::Tensor x = at(key + ".x").clone().requires_grad_(true);
      const torch::Tensor y = layer->forward(x);
      EXPECT_TRUE(bitwise_equal(y.detach(), at(key + ".y")));
      y.backward(at(key + ".grad_y"));
      EXPECT_TRUE(bitwise_equal(x.grad(), at(key + ".grad_x")));
      EXPECT_TRUE(bitwise_equal(layer->weight.grad(), at(key + ".grad_weight")));
      // Disabled: a plain linear.
      layer->fake_quant_enabled = false;
      {
        torch::NoGradGuard no_grad;
        EXPECT_TRUE(bitwise_equal(layer->forward(at(key + ".x")), at(key + ".y_disabled")));
      }
      // The convert: int4 values, scales and zeros as torchao's Int8DynActInt4WeightLinear holds them.
      const models::Int4GroupWeight q = models::quantize_per_group_int4(at(key + ".weight"), g);
      EXPECT_TRUE(bitwise_equal(q.values, at(key + ".values")));
      EXPECT_TRUE(bitwise_equal(q.scales, at(key + ".scales")));
      EXPECT_TRUE(bitwise_equal(q.zeros, at(key + ".zeros")));
      EXPECT_TRUE(bitwise_equal(models::unpack_int4(models::pack_int4(q.values)), q.values));
      ++cases;
    }
  }
  EXPECT_EQ(cases, 4);
}

// As QLoRA's: the gradients bitwise, the output within its rounding bound beside TorchTune's.
TEST(FakeQuant8da4w, QatLoraLinearEqualsTorchTune) {
  SKIP_WITHOUT_QUANT_ORACLE();
  LoraLinear layer = lora_layer("qat_lora", 512, 64, 4, 8.0, models::BaseWeights::kDense);
  layer->enable_fake_quant(256);
  const torch::Tensor x = at("qat_lora.x").clone().requires_grad_(true);
  const torch::Tensor y = layer->forward(x);
  // The base product is fq_a(x) fq_w(W)^T (bitwise torchao's: the test above); the adapter reads x.
  const torch::Tensor fq_x = models::fake_quantize_per_token_int8(at("qat_lora.x"));
  const torch::Tensor fq_w = models::fake_quantize_per_group_int4(at("qat_lora.weight"), 256);
  const torch::Tensor a = at("qat_lora.lora_a"), b = at("qat_lora.lora_b");
  EXPECT_TRUE(
      equal_within_rounding(y.detach(), at("qat_lora.y"), {fq_x, fq_w.t(), at("qat_lora.x"), a.t(), b.t(), 2.0}));
  y.backward(at("qat_lora.grad_y"));
  EXPECT_TRUE(bitwise_equal(x.grad(), at("qat_lora.grad_x")));
  EXPECT_TRUE(bitwise_equal(layer->lora_a->weight.grad(), at("qat_lora.grad_lora_a")));
  EXPECT_TRUE(bitwise_equal(layer->lora_b->weight.grad(), at("qat_lora.grad_lora_b")));
  EXPECT_FALSE(layer->weight.grad().defined());  // the base stays frozen
}

TEST(FakeQuant8da4w, PackingAndErrors) {
  const torch::Tensor values = torch::tensor({-8, -1, 0, 7, 3, -5}, torch::kInt8).view({1, 6});
  const torch::Tensor packed = models::pack_int4(values);
  EXPECT_EQ(packed.scalar_type(), torch::kUInt8);
  // -8 = 0b1000 high, -1 = 0b1111 low: 0x8F; 0, 7: 0x07; 3, -5 = 0b1011: 0x3B.
  EXPECT_TRUE(torch::equal(packed, torch::tensor({0x8F, 0x07, 0x3B}, torch::kUInt8).view({1, 3})));
  EXPECT_TRUE(torch::equal(models::unpack_int4(packed), values));
  EXPECT_THROW(models::pack_int4(torch::tensor({8, 0}, torch::kInt8).view({1, 2})), std::invalid_argument);
  test::expect_error<std::invalid_argument>(
      [] {
        models::fake_quantize_per_group_int4(torch::randn({4, 100}), 32);
      },
      {"[4, 100]", "32"});
  EXPECT_THROW(models::fake_quantize_per_group_int4(torch::randn({4, 64}), 1), std::invalid_argument);
  EXPECT_THROW(models::fake_quantize_per_token_int8(torch::ones({4, 64}, torch::kInt32)), std::invalid_argument);
  test::expect_error<std::invalid_argument>(
      [] {
        torch::Tensor w = torch::randn({2, 64});
        w[0][3] = std::nanf("");
        models::quantize_per_group_int4(w, 32);
      },
      {"NaN"});
  // Straight-through: the gradient passes unchanged, whatever the rounding.
  const torch::Tensor x = torch::randn({3, 64}).requires_grad_(true);
  const torch::Tensor gy = torch::randn({3, 64});
  models::fake_quantize_per_token_int8(x).backward(gy);
  EXPECT_TRUE(torch::equal(x.grad(), gy));
}

TEST(QuantisedLlama, Nf4ModelIsTheNf4OfTheDenseModelAndHoldsAQuarterOfItsProjectionBytes) {
  // Shapes every projection of which NF4 takes (numel % 16384 == 0).
  models::LlamaConfig c = models::LlamaConfig::preset("tiny");
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.head_dim = 32;
  c.vocab_size = 300;
  models::LlamaForCausalLM dense{nullptr}, nf4{nullptr};
  {
    const test::DefaultDtype bf16(torch::kBFloat16);
    torch::manual_seed(3);
    dense = models::LlamaForCausalLM(c);
    torch::manual_seed(3);
    nf4 = models::LlamaForCausalLM(c, models::BaseWeights::kNf4);
  }
  std::int64_t dense_bytes = 0, nf4_bytes = 0;
  auto* dense_layer = dense->named_modules()["model.layers.1.mlp.down_proj"]->as<models::LoraLinearImpl>();
  auto* nf4_layer = nf4->named_modules()["model.layers.1.mlp.down_proj"]->as<models::LoraLinearImpl>();
  // The same random draws: the NF4 weight is the NF4 of the dense one.
  EXPECT_TRUE(torch::equal(nf4_layer->nf4.dequantize(), Nf4Weight::quantize(dense_layer->weight).dequantize()));
  for (const auto& m : dense->modules()) {
    if (const auto* l = m->as<models::LoraLinearImpl>(); l != nullptr && l->out_features != c.vocab_size) {
      dense_bytes += l->base_nbytes();
    }
  }
  for (const auto& m : nf4->modules()) {
    if (const auto* l = m->as<models::LoraLinearImpl>(); l != nullptr && l->is_nf4()) nf4_bytes += l->base_nbytes();
  }
  EXPECT_GT(nf4_bytes, 0);
  EXPECT_LE(static_cast<double>(nf4_bytes) / static_cast<double>(dense_bytes), 0.30);
  // Embeddings, norms and the head stay dense; forward and backward to the adapters run.
  EXPECT_EQ(nf4->named_parameters().size(), 2u + 2u * 2u + 1u);  // embed, lm_head, 2 norms x 2 layers, final norm
  const auto trainable = nf4->apply_lora(models::LoraOptions{});
  EXPECT_EQ(trainable.size(), 2u * 6u * 2u);
  nf4->train();
  const torch::Tensor tokens = torch::randint(0, 300, {2, 9}, torch::kInt64);
  nf4->forward(tokens).pow(2).mean().backward();
  for (const auto& p : trainable) ASSERT_TRUE(p.grad().defined());
  // Fake quantisation is refused on NF4 weights.
  test::expect_error<ConfigError>([&] { nf4->enable_fake_quant(32, false); }, {"NF4"});
  // A preset whose projections NF4 cannot take is named.
  test::expect_error<ConfigError>(
      [] { models::LlamaForCausalLM(models::LlamaConfig::preset("tiny"), models::BaseWeights::kNf4); },
      {"model.layers.0.self_attn.q_proj", "16384"});
}

TEST(QuantisedLlama, FullQatFakeQuantisesEveryDivisibleLinearAndQatLoraOnlyTheAdapted) {
  models::LlamaConfig c = models::LlamaConfig::preset("tiny");  // hidden 64, MLP 128, vocab 128256
  c.vocab_size = 300;
  models::LlamaForCausalLM model(c);
  std::vector<std::string> skipped;
  const auto done = model->enable_fake_quant(128, /*lora_only=*/false, &skipped);
  // in-features 64 (q, k, v, gate, up, the head) are not divisible by 128; o_proj (64) neither; down (128) is.
  EXPECT_EQ(done, (std::vector<std::string>{"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"}));
  EXPECT_EQ(skipped.size(), 2u * 6u + 1u);
  EXPECT_EQ(skipped.back(), "lm_head");
  models::LlamaForCausalLM all(c);
  EXPECT_EQ(all->enable_fake_quant(32, false).size(), 2u * 7u + 1u);  // every projection and the untied head

  models::LlamaForCausalLM lora(c);
  models::LoraOptions o;
  o.targets = {"q_proj", "mlp"};
  lora->apply_lora(o);
  test::expect_error<ConfigError>([&] { lora->enable_fake_quant(128, /*lora_only=*/true); },
                                  {"model.layers.0.self_attn.q_proj", "64 in-features", "--qat-group-size 128"});
  EXPECT_EQ(lora->enable_fake_quant(32, true).size(), 2u * 4u);

  // Enabled fake quantisation changes the logits; disabled, they are the plain model's.
  const torch::Tensor tokens = torch::randint(0, 300, {1, 7}, torch::kInt64);
  torch::NoGradGuard no_grad;
  models::LlamaForCausalLM plain(c);
  torch::manual_seed(0);
  models::LlamaForCausalLM a(c);
  torch::manual_seed(0);
  models::LlamaForCausalLM b(c);
  b->enable_fake_quant(32, false);
  EXPECT_FALSE(torch::equal(a->forward(tokens), b->forward(tokens)));
  b->set_fake_quant_enabled(false);
  EXPECT_TRUE(torch::equal(a->forward(tokens), b->forward(tokens)));
}

// Building a QLoRA model holds its NF4 weights and, while one projection is quantised, that
// projection's dense draw, its scaled copy and the nearest-code search's [chunk, 16] differences:
// not a multiple of the projection. torchao's search (1Mi elements with the difference and its abs
// alive at once) held 128 MiB in fp32: the build of a 4-layer model with 2816 x 1024 projections
// peaked 143 MiB above what it kept, now 34.
TEST(Nf4, BuildingAQloraModelHoldsOneProjectionAtATime) {
  models::LlamaConfig c = test::eight_layer_llama();
  c.hidden_size = 1024;
  c.intermediate_size = 2816;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  auto probe = std::make_shared<test::HostTensorBytes>();
  {
    const c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, probe);
    const models::LlamaForCausalLM model(c, models::BaseWeights::kNf4);
    const std::int64_t projection = c.hidden_size * c.intermediate_size * 4;  // fp32
    const std::int64_t search = (std::int64_t{1} << 18) * 16 * 4;
    EXPECT_LE(probe->peak - probe->current, 2 * projection + search + (std::int64_t{1} << 20))
        << "peak " << probe->peak << " bytes, kept " << probe->current;
  }
}

}  // namespace
}  // namespace mgbench
