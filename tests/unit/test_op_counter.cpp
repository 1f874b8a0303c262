// train/op_counter: the ATen operators of a step counted as torch.profiler counts its aten:: events
// (the oracle: torch.profiler's own Kineto profiler over the same calls).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <set>
#include <stdexcept>

#include <torch/csrc/autograd/profiler_kineto.h>

#include "train/op_counter.h"

namespace mgbench::train {
namespace {

/// The aten:: events torch.profiler records while fn runs: its Kineto profiler, which Python's
/// torch.profiler.profile drives, with CPU activities (nested events included).
std::int64_t profiler_aten_events(const std::function<void()>& fn) {
  namespace prof = torch::autograd::profiler;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<torch::profiler::impl::ActivityType> cpu{torch::profiler::impl::ActivityType::CPU};
  prof::prepareProfiler(config, cpu);
  prof::enableProfiler(config, cpu);
  fn();
  const std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  std::int64_t n = 0;
  for (const auto& event : result->events()) n += event.name().rfind("aten::", 0) == 0 ? 1 : 0;
  return n;
}

TEST(OpCounter, CountsWhatTorchProfilerCountsForwardBackwardAndOptimizer) {
  torch::manual_seed(0);
  torch::nn::Linear lin(8, 4);
  torch::optim::AdamW adamw(lin->parameters(), torch::optim::AdamWOptions(1e-3));
  const torch::Tensor x = torch::randn({3, 8});
  const torch::Tensor y = torch::randn({3, 4});
  const auto step = [&] {
    adamw.zero_grad();
    (lin->forward(x) - y).pow(2).sum().backward();  // backward's ops run on this thread on the CPU
    adamw.step();
  };
  step();  // the optimizer's state created: the steps below are alike
  std::int64_t counted = 0;
  {
    const OpCounter ops;
    step();
    counted = ops.count();
  }
  const std::int64_t profiled = profiler_aten_events(step);
  EXPECT_GT(counted, 20);  // forward, backward and AdamW's per-parameter ops
  EXPECT_EQ(counted, profiled);
}

TEST(OpCounter, CountsOnlyWhileAliveAndOneAtATime) {
  const torch::Tensor a = torch::ones({4});
  std::int64_t counted = 0;
  {
    const OpCounter ops;
    EXPECT_THROW(OpCounter second, std::logic_error);
    (void)(a + a);  // aten::add
    counted = ops.count();
  }
  EXPECT_EQ(counted, 1);
  (void)(a * a);  // after: not counted, and a new counter starts from 0
  const OpCounter again;
  EXPECT_EQ(again.count(), 0);
}

}  // namespace
}  // namespace mgbench::train
