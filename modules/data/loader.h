#pragma once
// ImageLoader: assembles batches on a background thread, ahead of the training loop
// (the role of torch.utils.data.DataLoader with a prefetch queue). A batch stays uint8 in host
// memory ([B, 1, H, W], 784 B per MNIST sample); with pin_memory it is assembled directly in
// page-locked memory so the host-to-device copy can be asynchronous.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "data/mnist.h"
#include "data/sampler.h"

namespace mgbench::data {

/// A transform the loader thread applies to each batch's images (`--upscale host`: the paper's
/// host-side Resize/Normalize, so float images cross PCIe).
using HostTransform = std::function<torch::Tensor(const torch::Tensor&)>;

struct ImageBatch {
  torch::Tensor images;  // uint8 [B, 1, H, W] (or the HostTransform's output), host, pinned when requested
  torch::Tensor labels;  // int64 [B], host
  PlannedBatch plan;
};

class ImageLoader {
 public:
  /// Starts the worker thread over plan. prefetch: batches assembled ahead (>= 1).
  /// pin_memory: allocate batches in page-locked memory (needs a CUDA build and device).
  /// transform: applied to the images on the worker thread (its output pinned when pin_memory).
  ImageLoader(const MnistSplit& dataset, std::vector<PlannedBatch> plan, int prefetch, bool pin_memory,
              HostTransform transform = {});
  ~ImageLoader();
  ImageLoader(const ImageLoader&) = delete;
  ImageLoader& operator=(const ImageLoader&) = delete;

  /// The next batch in plan order, or nullopt at the end. Rethrows a worker exception.
  std::optional<ImageBatch> next();

 private:
  void run();
  ImageBatch assemble(PlannedBatch plan) const;

  const MnistSplit& dataset_;
  std::vector<PlannedBatch> plan_;
  std::size_t capacity_;
  bool pin_memory_;
  HostTransform transform_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<ImageBatch> ready_;
  std::size_t delivered_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

/// Builds one batch synchronously (evaluation, tests).
ImageBatch assemble_batch(const MnistSplit& dataset, const std::vector<std::int64_t>& indices, bool pin_memory);

}  // namespace mgbench::data
