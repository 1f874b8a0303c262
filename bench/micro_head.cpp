// The language-model head's log-probabilities of the targets, forward and backward, with the
// weight frozen (LoRA, QLoRA, DPO): models::target_log_probs with the input gradient's factor
// computed in forward against its peer in the same binary, the logits recomputed in backward.
//   BM_FrozenHead/factor/<dtype>     FrozenHeadGradient::kFactorInForward (the default)
//   BM_FrozenHead/recompute/<dtype>  FrozenHeadGradient::kRecompute
// 1024 target positions, hidden 512, vocabulary 32768; dtype 0 fp32, 1 bf16; one thread.
// Run: build/bench/mgbench_micro --benchmark_filter=FrozenHead
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "models/log_probs.h"

namespace {

void frozen_head(benchmark::State& state, mgbench::models::FrozenHeadGradient how) {
  torch::set_num_threads(1);
  torch::manual_seed(0);
  const torch::ScalarType dtype = state.range(0) == 0 ? torch::kFloat32 : torch::kBFloat16;
  constexpr std::int64_t kRows = 1024, kHidden = 512, kVocab = 32768;
  const torch::Tensor weight = (torch::randn({kVocab, kHidden}) * 0.02).to(dtype);
  const torch::Tensor start = torch::randn({kRows, kHidden}).to(dtype);
  const torch::Tensor targets = torch::randint(0, kVocab, {kRows}, torch::kInt64);
  for (auto _ : state) {
    torch::Tensor hidden = start.clone().requires_grad_(true);
    mgbench::models::target_log_probs(hidden, weight, targets, std::int64_t{1} << 26, how).sum().backward();
    benchmark::DoNotOptimize(hidden.grad().data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * kRows);  // target positions per second
}

void BM_FrozenHeadFactor(benchmark::State& s) { frozen_head(s, mgbench::models::FrozenHeadGradient::kFactorInForward); }
void BM_FrozenHeadRecompute(benchmark::State& s) { frozen_head(s, mgbench::models::FrozenHeadGradient::kRecompute); }

BENCHMARK(BM_FrozenHeadFactor)
    ->Name("BM_FrozenHead/factor")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(3.0);
BENCHMARK(BM_FrozenHeadRecompute)
    ->Name("BM_FrozenHead/recompute")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(3.0);

}  // namespace
