// One MobileNetV2 training step (forward, cross-entropy, backward, SGD) on a [32, 1, S, S] batch,
// in the two memory layouts, each the other's peer in the same binary:
//   BM_TrainStep/nchw/S   default (contiguous) layout
//   BM_TrainStep/nhwc/S   channels_last model and input (mgbench's default, --channels-last)
// Run: build/bench/mgbench_micro --benchmark_filter=TrainStep
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "models/mobilenet_v2.h"
#include "models/state_dict.h"

namespace {

void train_step(benchmark::State& state, bool channels_last) {
  torch::set_num_threads(1);
  torch::manual_seed(0);
  mgbench::models::MobileNetV2 model(mgbench::models::MobileNetV2Options{10, 1.0});
  if (channels_last) mgbench::models::to_channels_last(*model);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  torch::Tensor x = torch::randn({32, 1, state.range(0), state.range(0)});
  if (channels_last) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
  const torch::Tensor y = torch::randint(0, 10, {32}, torch::kLong);
  for (auto _ : state) {
    sgd.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    sgd.step();
  }
  state.SetItemsProcessed(state.iterations() * 32);
}

void BM_TrainStepNchw(benchmark::State& state) { train_step(state, false); }
void BM_TrainStepNhwc(benchmark::State& state) { train_step(state, true); }

BENCHMARK(BM_TrainStepNchw)->Name("BM_TrainStep/nchw")->Arg(32)->Arg(64)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_TrainStepNhwc)->Name("BM_TrainStep/nhwc")->Arg(32)->Arg(64)->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace
