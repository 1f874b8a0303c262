// Quantised fine-tuning's kernels on the shapes of Llama 3.2 1B (hidden 2048, intermediate 8192),
// bf16, each the same work as its torchao 0.11 peer in bench/peer_quant.py (bench/compare_quant.sh
// runs both and prints the ratios):
//   BM_Nf4/quantize/<out>x<in>     Nf4Weight::quantize           vs to_nf4(w, 64, 256)
//   BM_Nf4/dequantize/<out>x<in>   Nf4Weight::dequantize         vs NF4Tensor.get_original_weight()
//   BM_QatLinear/<tokens>          8da4w LoraLinear forward + backward (grad x and W), group 256, vs
//                                  Int8DynActInt4WeightQATQuantizer(256).prepare()'s linear
// Run: build/bench/mgbench_micro --benchmark_filter='Nf4|QatLinear'
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "models/llama.h"
#include "models/nf4.h"

namespace {

using mgbench::models::LoraLinear;
using mgbench::models::Nf4Weight;

torch::Tensor weight(std::int64_t out, std::int64_t in) {
  torch::manual_seed(0);
  return (torch::randn({out, in}) * 0.02).to(torch::kBFloat16);
}

void BM_Nf4Quantize(benchmark::State& state) {
  const torch::Tensor w = weight(state.range(0), state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(Nf4Weight::quantize(w));
  state.SetItemsProcessed(state.iterations() * w.numel());
}

void BM_Nf4Dequantize(benchmark::State& state) {
  const Nf4Weight q = Nf4Weight::quantize(weight(state.range(0), state.range(1)));
  for (auto _ : state) benchmark::DoNotOptimize(q.dequantize());
  state.SetItemsProcessed(state.iterations() * state.range(0) * state.range(1));
}

/// One fake-quantised linear (2048 -> 2048) forward and backward on [1, tokens, 2048] bf16.
void BM_QatLinear(benchmark::State& state) {
  torch::manual_seed(0);
  LoraLinear layer(2048, 2048);
  {
    torch::NoGradGuard no_grad;
    layer->weight.set_data(weight(2048, 2048));
  }
  layer->enable_fake_quant(256);
  const torch::Tensor x = torch::randn({1, state.range(0), 2048}).to(torch::kBFloat16).requires_grad_(true);
  const torch::Tensor grad_y = torch::randn({1, state.range(0), 2048}).to(torch::kBFloat16);
  for (auto _ : state) {
    layer->weight.mutable_grad() = torch::Tensor();
    x.mutable_grad() = torch::Tensor();
    layer->forward(x).backward(grad_y);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

BENCHMARK(BM_Nf4Quantize)
    ->Name("BM_Nf4/quantize")
    ->Args({2048, 2048})
    ->Args({8192, 2048})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Nf4Dequantize)
    ->Name("BM_Nf4/dequantize")
    ->Args({2048, 2048})
    ->Args({8192, 2048})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_QatLinear)->Arg(512)->Unit(benchmark::kMillisecond);

}  // namespace
