// Causal self-attention, forward and backward, on the CPU: models::causal_attention (four query
// chunks from 512 tokens) against its peer in the same binary, one scaled_dot_product_attention
// call with is_causal (the CPU flash kernel: every key block a query block meets).
//   BM_CausalAttention/chunked/<T>/<threads>  models::causal_attention
//   BM_CausalAttention/sdpa/<T>/<threads>     at::scaled_dot_product_attention(is_causal=True)
// q [2, 8, T, 64], k and v [2, 2, T, 64] (grouped-query, as Llama 3), fp32.
// Run: build/bench/mgbench_micro --benchmark_filter=CausalAttention
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "models/llama.h"

namespace {

void causal(benchmark::State& state, bool chunked) {
  torch::set_num_threads(static_cast<int>(state.range(1)));
  torch::manual_seed(0);
  const std::int64_t t = state.range(0);
  const torch::Tensor q0 = torch::randn({2, 8, t, 64}), k0 = torch::randn({2, 2, t, 64}),
                      v0 = torch::randn({2, 2, t, 64});
  for (auto _ : state) {
    const torch::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
                        v = v0.clone().requires_grad_();
    const torch::Tensor out = chunked ? mgbench::models::causal_attention(q, k, v)
                                      : at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, std::nullopt, true);
    out.sum().backward();
    benchmark::DoNotOptimize(q.grad().data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * 2 * t);  // tokens per second
}

void BM_Chunked(benchmark::State& s) { causal(s, true); }
void BM_Sdpa(benchmark::State& s) { causal(s, false); }

void shapes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t t : {256, 512, 1024, 2048}) {
    for (const std::int64_t threads : {1, 2}) b->Args({t, threads});
  }
  b->Unit(benchmark::kMillisecond)->MinTime(1.0);
}

BENCHMARK(BM_Chunked)->Name("BM_CausalAttention/chunked")->Apply(shapes);
BENCHMARK(BM_Sdpa)->Name("BM_CausalAttention/sdpa")->Apply(shapes);

}  // namespace
