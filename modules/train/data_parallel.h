#pragma once
// --strategy dp: the step of torch.nn.DataParallel in one process, the paper's DP baseline.
// Each forward replicates the model from devices[0] to every device (parameters and buffers
// copied: torch::nn::parallel::replicate), splits the batch along dim 0 into one chunk per
// device (torch.chunk sizes), runs the replicas in parallel threads
// (torch::nn::parallel::parallel_apply) and gathers the outputs on devices[0]. Backward sums the
// replicas' gradients into the model's parameters (replicate's ReduceAdd edges). As in PyTorch,
// buffer updates made in forward (BatchNorm running statistics) are kept from the replica on
// devices[0] only. The per-step replication is DP's known cost, which DDP removes.
// Follows torch/nn/parallel/data_parallel.py (PyTorch 2.x).
#include <vector>

#include <torch/torch.h>

#include "models/image_models.h"

namespace mgbench::train {

class DataParallel {
 public:
  /// model: on devices[0]. devices: where replicas run (CPU devices are accepted, for tests);
  /// one device: forward is the model's own. Throws std::invalid_argument for no devices or a
  /// model not on devices[0].
  DataParallel(models::ImageClassifier model, std::vector<torch::Device> devices);

  /// x: [B, C, H, W] on devices[0]. Returns logits [B, classes] on devices[0]. With B smaller than
  /// the number of devices, only B devices are used.
  torch::Tensor forward(const torch::Tensor& x);

  const std::vector<torch::Device>& devices() const { return devices_; }

 private:
  models::ImageClassifier model_;
  std::vector<torch::Device> devices_;
};

}  // namespace mgbench::train
