#pragma once
// The device side of a training step, identical in shape on the CPU and on a GPU:
//  - PhaseClock: per-step phase times. On the CPU, host clock laps. On a GPU, CUDA events
//    recorded on the compute stream at each phase boundary and read once per step after the
//    step's own host sync, so timing adds no synchronisation: a phase's time is the span of the
//    GPU timeline between its boundaries (the work it queued, or the GPU idling while the host
//    prepared it). Each phase is also an NVTX range (Nsight Systems shows the same phases).
//  - DeviceFeeder: a recipe's host batches from the BatchLoader to the device, every tensor of
//    the batch. With pin_memory on a GPU, a thread of its own (a Prefetcher) takes the loader's
//    page-locked batches, copies them with non_blocking copies on a dedicated copy stream and runs
//    the recipe's device-side preparation (Recipe::prepare_on_device: nvJPEG decoding) behind the
//    copies on that stream, `depth` batches ahead of the step: neither the copies nor the
//    preparation's host work (nvJPEG's parsing, the per-image crop launches) lands on the training
//    thread, and their GPU work overlaps the steps before, as DALI's prefetching pipeline does. The
//    compute stream waits on an event per batch (no host sync) and the caching allocator is told the
//    batch is used on the compute stream. Without pin_memory, the copy is a plain synchronous copy
//    from pageable memory (PyTorch with pin_memory=False) and the preparation follows it on the
//    training thread. On the CPU there is nothing to copy: batches are used in place and no h2d time
//    is recorded.
// Follows the prefetching pattern of NVIDIA Apex / PyTorch's DataLoader(pin_memory=True) + .to(non_blocking=True).
#include <functional>
#include <memory>
#include <optional>

#include <torch/torch.h>

#include "data/loader.h"
#include "profile/cuda_activity.h"
#include "results/schema.h"
#include "runtime/device.h"

namespace mgbench::train {

/// Not copyable (it owns its events), as DeviceFeeder.
class PhaseClock {
 public:
  explicit PhaseClock(const torch::Device& device);
  ~PhaseClock();

  /// Closes the open phase (if any) and opens `phase`.
  void enter(results::Phase phase);
  /// Closes the open phase and returns the time of every phase since the last take() [s].
  /// On a GPU this waits for the last boundary event (normally already passed).
  results::PhaseTimes take();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class DeviceFeeder {
 public:
  /// async: pinned batches, the feeder's thread and copy stream, `depth` (>= 1) batches ahead;
  /// needs a CUDA device (ignored on the CPU, where batches are used in place). prepare (may be
  /// empty): called on each batch this rank computes on (plan.compute), once its tensors are on the
  /// device -- with async on the feeder's thread with the copy stream current, else on the calling
  /// thread, its host time the transform phase. What it throws, as the loader's errors, next()
  /// rethrows in the batch's turn.
  DeviceFeeder(data::BatchLoader& loader, const torch::Device& device, bool async, int depth,
               std::function<data::Batch(data::Batch)> prepare = {});
  ~DeviceFeeder();
  /// The next batch with its tensors on the device, or nullopt at the end of the epoch. Time
  /// waiting for the loader (async: for the feeder's thread) goes to the data phase, copies to h2d
  /// (async: the compute stream's wait for the batch's copies and preparation; none on the CPU).
  std::optional<data::Batch> next(PhaseClock& clock);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Calls begin() on the thread that runs root's backward when it starts (root's gradient node: on a
/// GPU autograd's device thread, which launches the backward kernels and the gradient hooks' work),
/// and the function begin() returned once the backward is done (autograd's final callback). Call
/// before root.backward(); a root without a gradient node takes no hook. Follows torch's
/// Node::add_pre_hook and Engine::queue_callback (what DDP's reducer ends a backward with).
void on_backward(const torch::Tensor& root, std::function<std::function<void()>()> begin);
/// on_backward with an NVTX range "backward (autograd)" on the thread that starts the backward
/// (the main thread's "backward" phase range does not cover what autograd's thread launches). GPU
/// runs only; no-op on the CPU.
void mark_backward(const torch::Tensor& root);

/// batch with its tensors copied to device, synchronously, the copies labelled `purpose` for CUPTI
/// (cuda_summary's htod_train_* / htod_eval_*); on the CPU, batch itself.
data::Batch to_device(data::Batch batch, const torch::Device& device, profile::CopyPurpose purpose);

/// The torch device of a rank's placement (runtime/device.h is torch-free): cuda:N or cpu.
torch::Device to_torch_device(const runtime::DevicePlacement& placement);

/// Process-wide CUDA settings for a run on `device`: current device, cuDNN benchmark mode.
/// No-op on the CPU.
void configure_device(const torch::Device& device, bool cudnn_benchmark);
/// Peak bytes allocated and reserved by the CUDA caching allocator on device since the
/// process started; {-1, -1} on the CPU.
std::pair<std::int64_t, std::int64_t> device_memory_peaks(const torch::Device& device);
/// Blocks the host until the device's queued work is done (no-op on the CPU).
void synchronize(const torch::Device& device);

}  // namespace mgbench::train
