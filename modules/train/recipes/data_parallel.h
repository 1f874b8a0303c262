#pragma once
// --strategy dp: the step of torch.nn.DataParallel in one process, the paper's DP baseline.
// The model on devices[0] runs the first chunk itself; a replica per further device is cloned once
// (at construction, the CPU generator's state kept) and, every forward, refreshed from the model: parameters and
// buffers copied (torch.nn.parallel.replicate's broadcast), training modes mirrored, and each replica parameter given a
// gradient edge that sums into the model's parameter (LibTorch's ReduceAdd, as replicate sets them). The batch is split
// along dim 0 into one chunk per device (torch.chunk sizes); the replicas run on one thread per device with the
// caller's thread-local state (autocast, grad mode) and its current stream on that device, as Python's parallel_apply;
// the outputs are gathered on devices[0]. Buffer updates made in forward (BatchNorm running statistics) are the model's
// own chunk's, as in PyTorch. The per-step copy of the parameters is DP's known cost, which DDP removes. Follows
// torch/nn/parallel/{data_parallel,replicate,parallel_apply}.py (PyTorch 2.x).
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "models/image_classifier.h"

namespace mgbench::train {

class DataParallel {
 public:
  /// model: on devices[0]. devices: where replicas run (CPU devices are accepted, for tests); one
  /// device: forward is the model's own. Clones the replicas (ImageClassifier::clone_classifier).
  /// Throws std::invalid_argument for no devices or a model not on devices[0].
  DataParallel(std::shared_ptr<models::ImageClassifier> model, std::vector<torch::Device> devices);

  /// x: [B, C, H, W] on devices[0]. Returns logits [B, classes] on devices[0], in the dtype the
  /// model computes under the caller's autocast (every replica runs under it). With B smaller
  /// than the number of devices, only B devices are used. Rethrows the first replica's exception.
  torch::Tensor forward(const torch::Tensor& x);

  const std::vector<torch::Device>& devices() const { return devices_; }
  /// Replicas (devices - 1), cloned at construction, never again.
  std::size_t replicas() const { return replicas_.size(); }

 private:
  /// Copies parameters and buffers into replicas[0, used), mirrors training modes and sets the
  /// gradient edges back to the model's parameters.
  void refresh(std::size_t used);

  std::shared_ptr<models::ImageClassifier> model_;
  std::vector<torch::Device> devices_;
  std::vector<std::shared_ptr<models::ImageClassifier>> replicas_;  // [i] runs on devices_[i + 1]
};

}  // namespace mgbench::train
