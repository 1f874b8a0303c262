#include "train/device_pipeline.h"

#include <array>
#include <optional>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>

#include "core/config.h"
#include "core/prefetcher.h"
#include "core/timer.h"
#include "profile/cupti_collector.h"
#include "profile/nvtx.h"

#if MGBENCH_HAVE_CUDA
#include <ATen/Context.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace mgbench::train {

using results::Phase;

// ---------------------------------------------------------------- PhaseClock
struct PhaseClock::Impl {
  bool cuda = false;
  std::optional<Phase> open;
  std::optional<profile::NvtxRange> range;
  results::PhaseTimes times;
  double opened_s = 0;  // CPU: host time the open phase began
#if MGBENCH_HAVE_CUDA
  // GPU: one event per boundary; boundaries[i] closes phases[i].
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> pool;
  std::vector<Phase> phases;
  std::size_t used = 0;
  at::cuda::CUDAEvent& next_event() {
    if (used == pool.size()) pool.push_back(std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault));
    return *pool[used++];
  }
#endif

  void boundary(std::optional<Phase> next) {
    const double now = now_s();
#if MGBENCH_HAVE_CUDA
    if (cuda) {
      next_event().record(c10::cuda::getCurrentCUDAStream());
      phases.push_back(open.value_or(Phase::kCount));  // the first boundary closes nothing
    }
#endif
    if (!cuda && open) times.*results::kPhaseFields[static_cast<std::size_t>(*open)].seconds += now - opened_s;
    range.reset();
    open = next;
    opened_s = now;
    if (next) range.emplace(results::kPhaseFields[static_cast<std::size_t>(*next)].name);
  }
};

PhaseClock::PhaseClock(const torch::Device& device) : impl_(std::make_unique<Impl>()) {
  impl_->cuda = device.is_cuda();
}
PhaseClock::~PhaseClock() = default;

void PhaseClock::enter(Phase phase) {
  if (impl_->open == phase) return;
  impl_->boundary(phase);
}

results::PhaseTimes PhaseClock::take() {
  auto& m = *impl_;
  if (m.open) m.boundary(std::nullopt);
#if MGBENCH_HAVE_CUDA
  if (m.cuda && m.used > 1) {
    m.pool[m.used - 1]->synchronize();
    for (std::size_t i = 1; i < m.used; ++i) {
      const Phase p = m.phases[i];
      if (p == Phase::kCount) continue;
      m.times.*results::kPhaseFields[static_cast<std::size_t>(p)].seconds +=
          static_cast<double>(m.pool[i - 1]->elapsed_time(*m.pool[i])) / 1e3;
    }
  }
  m.used = 0;
  m.phases.clear();
#endif
  results::PhaseTimes out = m.times;
  m.times = {};
  return out;
}

// ---------------------------------------------------------------- DeviceFeeder
struct DeviceFeeder::Impl {
  data::BatchLoader& loader;
  torch::Device device;
  std::function<data::Batch(data::Batch)> prepare;
  Impl(data::BatchLoader& l, const torch::Device& d, std::function<data::Batch(data::Batch)> p)
      : loader(l), device(d), prepare(std::move(p)) {}
  /// Whether the recipe prepares batch: one this rank computes on (ddp-rr's others pass as loaded).
  bool prepares(const data::Batch& batch) const { return prepare && batch.plan.compute; }
  /// The synchronous path's preparation, on the training thread: its host time is the transform phase.
  data::Batch prepared(data::Batch batch, PhaseClock& clock, Phase after) {
    if (!prepares(batch)) return batch;
    clock.enter(Phase::kTransform);
    data::Batch out = prepare(std::move(batch));
    clock.enter(after);
    return out;
  }
#if MGBENCH_HAVE_CUDA
  struct Staged {
    data::Batch batch;
    at::cuda::CUDAEvent ready;  // on the copy stream, after the batch's copies and preparation
  };
  std::optional<c10::cuda::CUDAStream> copy_stream;
  /// On the feeder's thread: the loader's next batch copied on the copy stream (pinned, non-blocking)
  /// and prepared behind its copies, on that stream too.
  std::optional<Staged> stage_next() {
    std::optional<data::Batch> host = loader.next();
    if (!host) return std::nullopt;
    const profile::NvtxRange range("feeder: h2d + prepare");
    const c10::cuda::CUDAStreamGuard on_copy_stream(*copy_stream);  // and the rank's device
    const torch::NoGradGuard no_grad;
    const profile::CopyScope training_batch(profile::CopyPurpose::kTrainBatch);
    for (auto& t : host->tensors) t = t.to(device, /*non_blocking=*/true);
    if (prepares(*host)) *host = prepare(std::move(*host));
    Staged staged{std::move(*host), at::cuda::CUDAEvent()};
    staged.ready.record(*copy_stream);
    return staged;
  }
  std::optional<Prefetcher<Staged>> staged;  // last: its thread reads the members above
#endif
};

DeviceFeeder::DeviceFeeder(data::BatchLoader& loader, const torch::Device& device, bool async, int depth,
                           std::function<data::Batch(data::Batch)> prepare)
    : impl_(std::make_unique<Impl>(loader, device, std::move(prepare))) {
#if MGBENCH_HAVE_CUDA
  if (async && device.is_cuda()) {
    auto& m = *impl_;
    m.copy_stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    m.staged.emplace([&m] { return m.stage_next(); }, static_cast<std::size_t>(std::max(depth, 1)));
  }
#else
  (void)async, (void)depth;
#endif
}

DeviceFeeder::~DeviceFeeder() = default;

data::Batch to_device(data::Batch batch, const torch::Device& device, profile::CopyPurpose purpose) {
  if (device.is_cpu()) return batch;
  const profile::CopyScope label(purpose);
  for (auto& t : batch.tensors) t = t.to(device);
  return batch;
}

std::optional<data::Batch> DeviceFeeder::next(PhaseClock& clock) {
  auto& m = *impl_;
#if MGBENCH_HAVE_CUDA
  if (m.staged) {
    clock.enter(Phase::kData);  // waiting for the feeder's thread: the loader, the copies, the preparation
    std::optional<Impl::Staged> front = m.staged->next();
    if (!front) return std::nullopt;
    clock.enter(Phase::kH2d);  // the compute stream waiting for the copies and preparation still running
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(m.device.index());
    front->ready.block(compute);
    // Allocated on the copy stream, used on the compute stream: the allocator must not recycle
    // the memory before the compute stream is done with it.
    for (const auto& t : front->batch.tensors) {
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), compute);
    }
    return std::move(front->batch);
  }
#endif
  clock.enter(Phase::kData);
  std::optional<data::Batch> host = m.loader.next();
  if (!host) return host;
  if (m.device.is_cpu()) return m.prepared(std::move(*host), clock, Phase::kData);  // used in place: no copy
  clock.enter(Phase::kH2d);
  return m.prepared(to_device(std::move(*host), m.device, profile::CopyPurpose::kTrainBatch), clock, Phase::kH2d);
}

// ---------------------------------------------------------------- backward marks
namespace {

struct BackwardStart final : torch::autograd::FunctionPreHook {
  explicit BackwardStart(std::function<std::function<void()>()> b) : begin(std::move(b)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (begin) {
      std::function<void()> end = begin();
      begin = nullptr;  // once: the root runs once per backward
      if (end) torch::autograd::Engine::get_default_engine().queue_callback(std::move(end));
    }
    return grads;
  }
  std::function<std::function<void()>()> begin;
};

}  // namespace

void on_backward(const torch::Tensor& root, std::function<std::function<void()>()> begin) {
  if (const auto& node = root.grad_fn()) node->add_pre_hook(std::make_unique<BackwardStart>(std::move(begin)));
}

void mark_backward(const torch::Tensor& root) {
  if (!root.is_cuda()) return;
  on_backward(root, [] {
    const std::uint64_t id = profile::nvtx_range_start("backward (autograd)");
    return std::function<void()>([id] { profile::nvtx_range_end(id); });
  });
}

// ---------------------------------------------------------------- device helpers
torch::Device to_torch_device(const runtime::DevicePlacement& placement) {
  return placement.is_cuda() ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(placement.index))
                             : torch::Device(torch::kCPU);
}

void configure_device(const torch::Device& device, bool cudnn_benchmark) {
#if MGBENCH_HAVE_CUDA
  if (!device.is_cuda()) return;
  c10::cuda::set_device(device.index());
  at::globalContext().setBenchmarkCuDNN(cudnn_benchmark);
#else
  (void)device;
  (void)cudnn_benchmark;
#endif
}

std::pair<std::int64_t, std::int64_t> device_memory_peaks(const torch::Device& device) {
#if MGBENCH_HAVE_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    constexpr auto kAll = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return {stats.allocated_bytes[kAll].peak, stats.reserved_bytes[kAll].peak};
  }
#endif
  (void)device;
  return {-1, -1};
}

void synchronize(const torch::Device& device) {
#if MGBENCH_HAVE_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
  (void)device;
}

}  // namespace mgbench::train
