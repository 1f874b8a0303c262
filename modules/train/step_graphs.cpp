#include "train/step_graphs.h"

#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"

#if MGBENCH_HAVE_CUDA
#include <ATen/autocast_mode.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace mgbench::train {

GraphDecision resolve_cuda_graphs(CudaGraphs mode, const GraphFacts& facts) {
  if (mode == CudaGraphs::kOff) return {false, "--cuda-graphs off"};
  std::string blocker;
  if (!facts.cuda) {
    blocker = "the rank computes on the CPU (CUDA graphs replay GPU work)";
  } else if (facts.fully_sharded) {
    blocker = fmt::format(
        "--sharding fsdp over {} ranks: the units' all-gathers and reduce-scatters are issued by hooks on the host "
        "inside forward and backward, which a replayed graph would not run (DDP's all-reduce, after backward, "
        "allows graphs: --sharding none)",
        facts.world_size);
  } else if (facts.single_process) {
    blocker = "--strategy dp: its replicas run on threads of their own, one per GPU, outside the capture";
  } else {
    blocker = facts.recipe_blocker;
  }
  if (mode == CudaGraphs::kOn) {
    MGBENCH_REQUIRE(blocker.empty(), ConfigError, "--cuda-graphs on: {}; give --cuda-graphs auto or off", blocker);
    return {true, ""};
  }
  if (!blocker.empty()) return {false, blocker};
  return {false,
          "auto: graphs are not yet compared with the eager step on a GPU (docs/design.md, CUDA graphs); "
          "--cuda-graphs on uses them"};
}

std::string shape_key(const data::Batch& batch) {
  std::vector<std::string> parts;
  parts.reserve(batch.tensors.size());
  for (const torch::Tensor& t : batch.tensors) {
    if (!t.defined()) {
      parts.emplace_back("undefined");
      continue;
    }
    parts.push_back(fmt::format("{} {} [{}]/[{}]", t.device().str(), c10::toString(t.scalar_type()),
                                fmt::join(t.sizes(), ", "), fmt::join(t.strides(), ", ")));
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

GraphSchedule::GraphSchedule(int warmup, int max_graphs) : warmup_(warmup), max_graphs_(max_graphs) {
  MGBENCH_REQUIRE(warmup >= 1 && max_graphs >= 1, std::invalid_argument,
                  "GraphSchedule: warm-up {} and graph bound {} must be at least 1", warmup, max_graphs);
}

GraphAction GraphSchedule::next(const std::string& key) {
  auto found = shapes_.find(key);
  if (found == shapes_.end()) {
    if (live_ >= max_graphs_) {  // no graph left for a new shape: not tracked, eager (until forget)
      ++eager_;
      ++beyond_bound_;
      return GraphAction::kEager;
    }
    found = shapes_.emplace(key, Shape{}).first;
  }
  Shape& shape = found->second;
  if (shape.captured) {
    ++replays_;
    return GraphAction::kReplay;
  }
  if (shape.eager < warmup_ || live_ >= max_graphs_) {
    if (shape.eager >= warmup_) ++beyond_bound_;  // warmed up, but no graph is left
    ++shape.eager;
    ++eager_;
    return GraphAction::kEager;
  }
  shape.captured = true;
  ++live_;
  ++graphs_;
  ++replays_;  // a captured micro-batch is computed by its graph's first replay
  return GraphAction::kCapture;
}

std::int8_t graph_use(std::int64_t micro_batches, std::int64_t captured, std::int64_t replayed) {
  if (captured > 0) return results::kGraphCaptured;
  if (replayed == 0) return results::kGraphEager;
  return replayed == micro_batches ? results::kGraphReplayed : results::kGraphMixed;
}

void GraphSchedule::forget() {
  shapes_.clear();
  live_ = 0;
}

#if MGBENCH_HAVE_CUDA

namespace {

/// One shape's graph: its static inputs (the batch it was captured on, its tensors copied into
/// before each replay) and its static outputs.
struct ShapeGraph {
  at::cuda::CUDAGraph graph;
  data::Batch inputs;
  MicroBatchLoss outputs;
};

/// Autocast's cast cache off for a capture (a cached cast made in one capture is stale in the next;
/// torch.cuda.make_graphed_callables asks for cache_enabled=False), set back after.
class AutocastCacheOff {
 public:
  AutocastCacheOff() : before_(at::autocast::is_autocast_cache_enabled()) {
    at::autocast::set_autocast_cache_enabled(false);
  }
  ~AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(before_); }
  AutocastCacheOff(const AutocastCacheOff&) = delete;
  AutocastCacheOff& operator=(const AutocastCacheOff&) = delete;

 private:
  bool before_;
};

/// A stream of the graphs' own on device d: not one of c10's pool, whose 32 streams a device are
/// handed out in turn (CUDAStream.h), so that the loader's per-epoch copy stream is never the stream
/// a capture runs on (its copies would join the graph). Destroyed by ~Impl.
c10::cuda::CUDAStream own_stream(const torch::Device& d) {
  const c10::cuda::CUDAGuard on(d);
  cudaStream_t stream = nullptr;
  C10_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return c10::cuda::getStreamFromExternal(stream, d.index());
}

}  // namespace

struct MicroBatchGraphs::Impl {
  torch::Device device;
  c10::cuda::CUDAStream side;  // captures run on it (a graph cannot be captured on the default stream)
  c10::MempoolId_t pool{0, 0};
  std::map<std::string, std::unique_ptr<ShapeGraph>, std::less<>> graphs;
  // Each micro-batch's joins of the current stream and the side one, recorded anew each time (an
  // event made and destroyed per micro-batch costs two context-locking driver calls: event_pool.h).
  at::cuda::CUDAEvent ready, done;

  explicit Impl(const torch::Device& d) : device(d), side(own_stream(d)) {}
  /// Nothing replaying when the graphs and their pool go (the pool's memory is then free to others),
  /// then the stream. Errors are not thrown from here: a failing run's device may be in error.
  ~Impl() {
    (void)cudaStreamSynchronize(side.stream());
    graphs.clear();
    (void)cudaStreamDestroy(side.stream());
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  /// On the side stream (current): input's static copies made, work captured, the graph replayed.
  MicroBatchLoss capture(const std::string& key, const data::Batch& input, const MicroBatchWork& work) {
    auto entry = std::make_unique<ShapeGraph>();
    ShapeGraph& g = *entry;
    g.inputs = input;  // the host fields as captured; the tensors replaced by static copies
    for (torch::Tensor& t : g.inputs.tensors) {
      if (t.defined()) t = t.clone();  // outside the graph's pool; layout kept
    }
    // As torch.cuda.graph: nothing of the eager work still running while the capture starts, and
    // the allocator's cached blocks freed -- during a capture it neither frees them nor retries on
    // out-of-memory, so the eager warm-up's cache (a micro-batch's activations, on this stream) would
    // otherwise stand beside the graph's pool: a capture out of memory where the eager step fits.
    c10::cuda::device_synchronize();
    c10::cuda::CUDACachingAllocator::emptyCache();
    if (pool.first == 0 && pool.second == 0) pool = at::cuda::graph_pool_handle();
    {
      const AutocastCacheOff no_cache;
      // Thread-local: the feeder's thread keeps copying the next batches (and may allocate) while
      // this thread captures; autograd's device thread launches the backward into the capture stream.
      g.graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
      try {
        g.outputs = work(g.inputs, /*capturing=*/true);
        g.graph.capture_end();
      } catch (const std::exception& e) {
        abandon_capture(pool);
        throw std::runtime_error(
            fmt::format("--cuda-graphs on: capturing a micro-batch of shape {} failed ({}); "
                        "give --cuda-graphs off to run the step eagerly",
                        key, e.what()));
      }
    }
    g.graph.replay();  // this micro-batch's forward and backward
    log::info("cuda graphs: captured a micro-batch of shape {} ({} graph(s))", key, graphs.size() + 1);
    MicroBatchLoss out = g.outputs;
    graphs.emplace(key, std::move(entry));
    return out;
  }

  /// After a failed capture: the side stream's capture ended (its partial graph dropped), the CUDA
  /// error it left cleared, and the caching allocators out of their capture mode for `captured` --
  /// torch 2.11's CUDAGraph::capture_begin begins allocating to that pool in the device's caching
  /// allocator and in the pinned host one, and only capture_end ends both (in that mode the device
  /// allocator neither frees cached blocks nor retries on out-of-memory) -- with the capture's use
  /// of the pool released, so that the run's error report and results file can still use the
  /// device. Where capture_end itself failed after ending them (instantiating the graph), the device
  /// allocator refuses a second end, and the CUDAGraph releases the pool when destroyed: nothing to
  /// do here (a second release would take another graph's use of the shared pool).
  void abandon_capture(c10::MempoolId_t captured) const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(side.stream(), &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(side.stream(), &partial) == cudaSuccess && partial != nullptr) {
        cudaGraphDestroy(partial);
      }
    }
    (void)cudaGetLastError();
    try {
      c10::cuda::CUDACachingAllocator::endAllocateToPool(device.index(), captured);
    } catch (const c10::Error&) {
      return;  // "not currently recording to mempool_id": capture_end ended both allocators' modes
    }
    try {
      at::HostAllocator* host = at::getHostAllocator(at::kCUDA);
      host->end_allocate_to_pool(captured);
      host->release_pool(captured);
    } catch (const c10::Error&) {  // a build whose capture_begin left the host allocator alone
    }
    c10::cuda::CUDACachingAllocator::releasePool(device.index(), captured);
  }

  /// Every graph destroyed once the device is idle (none still replaying), and their pool with them:
  /// the next capture makes a new one.
  void forget() {
    c10::cuda::device_synchronize();
    graphs.clear();
    pool = {0, 0};
  }

  MicroBatchLoss replay(const std::string& key, const data::Batch& input) {
    ShapeGraph& g = *graphs.at(key);
    for (std::size_t k = 0; k < input.tensors.size(); ++k) {
      if (input.tensors[k].defined()) g.inputs.tensors[k].copy_(input.tensors[k], /*non_blocking=*/true);
    }
    g.graph.replay();
    return g.outputs;
  }
};

MicroBatchGraphs::MicroBatchGraphs(const torch::Device& device, int warmup, int max_graphs)
    : schedule_(warmup, max_graphs) {
  MGBENCH_REQUIRE(device.is_cuda(), ConfigError, "--cuda-graphs: {} is not a CUDA device", device.str());
  impl_ = std::make_unique<Impl>(device);
}

void MicroBatchGraphs::forget() {
  schedule_.forget();
  impl_->forget();
}

MicroBatchLoss MicroBatchGraphs::run(const data::Batch& input, const MicroBatchWork& work) {
  const std::string key = shape_key(input);
  const GraphAction action = schedule_.next(key);
  if (schedule_.beyond_bound() > 0 && !warned_beyond_bound_) {
    warned_beyond_bound_ = true;
    log::warn(
        "cuda graphs: {} shapes hold a graph, the bound: a micro-batch of shape {} and those of every further "
        "shape run eagerly (LLM recipes: a larger --pad-to-multiple gives fewer padded lengths)",
        schedule_.max_graphs(), key);
  }
  // Every micro-batch on the side stream, eager ones too (torch.cuda.graph's warm-up on the capture
  // stream: cuBLAS's workspace for it made outside a capture), joined both ways with the current
  // stream: the side waits for the batch's data, the current for the micro-batch's results.
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(impl_->device.index());
  impl_->ready.record(current);
  impl_->ready.block(impl_->side);
  MicroBatchLoss out;
  {
    const c10::cuda::CUDAStreamGuard on_side(impl_->side);
    switch (action) {
      case GraphAction::kEager:
        out = work(input, /*capturing=*/false);
        break;
      case GraphAction::kCapture:
        out = impl_->capture(key, input, work);
        break;
      case GraphAction::kReplay:
        out = impl_->replay(key, input);
        break;
    }
  }
  impl_->done.record(impl_->side);
  impl_->done.block(current);
  if (action != GraphAction::kEager) {
    // The graph's static outputs copied on the current stream, after the replay (done) and before the
    // next (its `ready` join): the caller's sums must not alias what the next replay of this graph -- or of
    // another graph of the shared pool, in blocks this one's capture had freed -- writes.
    out.loss = out.loss.clone();
    if (out.metrics.defined()) out.metrics = out.metrics.clone();
  }
  return out;
}

#else  // no CUDA in this build

struct MicroBatchGraphs::Impl {};

MicroBatchGraphs::MicroBatchGraphs(const torch::Device&, int warmup, int max_graphs) : schedule_(warmup, max_graphs) {
  throw ConfigError("--cuda-graphs on: this build has no CUDA");
}

void MicroBatchGraphs::forget() { schedule_.forget(); }

MicroBatchLoss MicroBatchGraphs::run(const data::Batch& input, const MicroBatchWork& work) {
  return work(input, /*capturing=*/false);
}

#endif

MicroBatchGraphs::~MicroBatchGraphs() = default;

std::string MicroBatchGraphs::totals() const {
  return fmt::format(
      "cuda graphs: {} capture(s), {} micro-batch(es) replayed, {} run eagerly ({} beyond the bound of "
      "{} graphs)",
      schedule_.graphs(), schedule_.replays(), schedule_.eager(), schedule_.beyond_bound(), schedule_.max_graphs());
}

}  // namespace mgbench::train
