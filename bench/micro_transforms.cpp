// Micro-benchmarks of the per-batch input path, each against its peer in the same binary:
//   BM_Transform/mgbench  uint8 [B,1,28,28] -> cast, normalise at 28x28, bilinear upscale (data/transforms)
//   BM_Transform/peer     the torchvision order: upscale the float image, then normalise at S x S
//   BM_Assemble           gathering B random MNIST samples (784 B each) into a batch (data/loader)
// Run: build/bench/mgbench_micro --benchmark_filter=Transform
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "data/loader.h"
#include "data/transforms.h"

namespace {

constexpr double kMean = 0.1307;
constexpr double kStd = 0.3081;

torch::Tensor batch_u8(std::int64_t b) { return torch::randint(0, 256, {b, 1, 28, 28}, torch::kUInt8); }

void BM_TransformMgbench(benchmark::State& state) {
  torch::set_num_threads(1);
  const torch::Tensor x = batch_u8(32);
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        mgbench::data::normalize_and_resize(x, state.range(0), torch::kFloat32, std::array{kMean}, std::array{kStd}));
  }
  state.SetItemsProcessed(state.iterations() * 32);
}

void BM_TransformPeer(benchmark::State& state) {
  torch::set_num_threads(1);
  const torch::Tensor x = batch_u8(32);
  namespace F = torch::nn::functional;
  for (auto _ : state) {
    torch::Tensor y = F::interpolate(x.to(torch::kFloat32).div(255.0),
                                     F::InterpolateFuncOptions()
                                         .size(std::vector<std::int64_t>{state.range(0), state.range(0)})
                                         .mode(torch::kBilinear)
                                         .align_corners(false));
    benchmark::DoNotOptimize(y.sub_(kMean).div_(kStd));
  }
  state.SetItemsProcessed(state.iterations() * 32);
}

void BM_Assemble(benchmark::State& state) {
  mgbench::data::MnistSplit split;
  split.rows = split.cols = 28;
  split.images.assign(60000u * 784u, 7);
  split.labels.assign(60000, 3);
  std::vector<std::int64_t> indices;
  for (int k = 0; k < state.range(0); ++k) indices.push_back((k * 7919) % 60000);
  for (auto _ : state) benchmark::DoNotOptimize(mgbench::data::assemble_mnist_batch(split, indices, false));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

BENCHMARK(BM_TransformMgbench)
    ->Name("BM_Transform/mgbench")
    ->Arg(32)
    ->Arg(100)
    ->Arg(224)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TransformPeer)->Name("BM_Transform/peer")->Arg(32)->Arg(100)->Arg(224)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Assemble)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
