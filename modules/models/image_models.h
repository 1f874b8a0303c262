#pragma once
// The image classifiers `mgbench image --model` can train: one row per model (name, help, factory),
// as nccl-tests' testColl descriptors. Adding a model: its file under models/ with a factory, and
// one row in image_models.cpp.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include <torch/torch.h>

namespace mgbench::models {

struct ImageModelOptions {
  std::int64_t num_classes = 10;
  double width_mult = 1.0;        // channel width multiplier (MobileNetV2's)
  double dropout = 0.2;           // before the classifier
  bool freeze_batchnorm = false;  // BatchNorm stays in eval mode in train(): per-sample maths independent of the batch
};

/// A classifier of images [B, 1 or 3, H, W] (the parameters' dtype) into logits [B, classes].
struct ImageClassifier {
  /// The network. Cloneable (module->clone(device) deep-copies it): --strategy dp replicates it.
  std::shared_ptr<torch::nn::Module> module;
  /// Runs `net` -- module or one of its clones -- on x.
  std::function<torch::Tensor(torch::nn::Module& net, const torch::Tensor& x)> forward;
};

enum class ImageModel { kMobileNetV2 };

struct ImageModelInfo {
  std::string_view name;  // --model
  ImageModel value;
  std::string_view help;
  ImageClassifier (*make)(const ImageModelOptions& options);
};

/// Every image model; the first is the default.
std::span<const ImageModelInfo> image_models();

}  // namespace mgbench::models
