// One AdamW step over the parameters of a Llama decoder (dim 512, 8 layers: 2 norms and 7
// projections each, ~25M elements in 73 tensors), fp32 and bf16, with the gradients set:
//   BM_AdamWStep/fused/<dtype>   train::FusedAdamW (at::_fused_adamw_: one kernel per dtype and device)
//   BM_AdamWStep/chain/<dtype>   LibTorch's torch::optim::AdamW (eight per-tensor ops per parameter)
//   BM_AdamWStep/normalised_in_kernel/<dtype>  FusedAdamW::step_scaled: the gradients divided by the loss
//                                normalisation inside the kernel (the loop's path without clipping)
//   BM_AdamWStep/normalised_pass/<dtype>       the same normalisation as a pass over the gradients
//                                (grad.mul_), then the fused step (the loop's path before)
//   (the factor is 1 in both, so that the gradients stay the same from one iteration to the next)
// dtype: 0 fp32, 1 bf16. Run: build/bench/mgbench_micro --benchmark_filter=AdamWStep
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "train/optim/optimizer.h"

namespace {

std::vector<torch::Tensor> llama_parameters(torch::ScalarType dtype) {
  constexpr std::int64_t kDim = 512, kHidden = 1408, kKv = 128, kLayers = 8;
  std::vector<torch::Tensor> params;
  const auto add = [&](std::vector<std::int64_t> shape) {
    auto p = torch::randn(shape, torch::kFloat32).to(dtype).set_requires_grad(true);
    p.mutable_grad() = torch::randn(shape, torch::kFloat32).to(dtype);
    params.push_back(p);
  };
  for (std::int64_t l = 0; l < kLayers; ++l) {
    add({kDim});           // attention norm
    add({kDim, kDim});     // q
    add({kKv, kDim});      // k
    add({kKv, kDim});      // v
    add({kDim, kDim});     // o
    add({kDim});           // ffn norm
    add({kHidden, kDim});  // gate
    add({kHidden, kDim});  // up
    add({kDim, kHidden});  // down
  }
  add({kDim});  // final norm
  return params;
}

enum class Step { kFused, kChain, kNormalisedInKernel, kNormalisedPass };

void adamw_step(benchmark::State& state, Step kind) {
  torch::set_num_threads(1);
  torch::manual_seed(0);
  const torch::ScalarType dtype = state.range(0) == 0 ? torch::kFloat32 : torch::kBFloat16;
  auto params = llama_parameters(dtype);
  const auto options = torch::optim::AdamWOptions(1e-5).weight_decay(0.01);
  std::unique_ptr<torch::optim::Optimizer> optimizer =
      kind == Step::kChain
          ? std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::AdamW>(params, options))
          : std::make_unique<mgbench::train::FusedAdamW>(params, options);
  auto* fused = dynamic_cast<mgbench::train::FusedAdamW*>(optimizer.get());
  const torch::Tensor divisor = torch::ones({});
  std::int64_t elements = 0;
  for (const auto& p : params) elements += p.numel();
  optimizer->step();  // the states allocated
  for (auto _ : state) {
    if (kind == Step::kNormalisedInKernel) {
      fused->step_scaled(divisor, {});
      continue;
    }
    if (kind == Step::kNormalisedPass) {
      torch::NoGradGuard no_grad;
      for (auto& p : params) p.mutable_grad().mul_(1.0);
    }
    optimizer->step();
  }
  state.SetItemsProcessed(state.iterations() * elements);  // parameters updated per second
}

void BM_AdamWStepFused(benchmark::State& state) { adamw_step(state, Step::kFused); }
void BM_AdamWStepChain(benchmark::State& state) { adamw_step(state, Step::kChain); }
void BM_AdamWStepInKernel(benchmark::State& state) { adamw_step(state, Step::kNormalisedInKernel); }
void BM_AdamWStepPass(benchmark::State& state) { adamw_step(state, Step::kNormalisedPass); }

BENCHMARK(BM_AdamWStepFused)->Name("BM_AdamWStep/fused")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_AdamWStepChain)->Name("BM_AdamWStep/chain")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_AdamWStepInKernel)
    ->Name("BM_AdamWStep/normalised_in_kernel")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK(BM_AdamWStepPass)
    ->Name("BM_AdamWStep/normalised_pass")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);

}  // namespace
