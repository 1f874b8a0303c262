#pragma once
// The image classifiers `mgbench image --model` can train: one row per model (name, factory, help),
// as nccl-tests' testColl descriptors. Adding a model: its file under models/ with a factory, and
// its row (and the factory's declaration) in image_models.cpp.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include <torch/torch.h>

#include "models/parameter_units.h"

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
  /// module's FSDP units (--sharding fsdp), or nullptr for a model without them. Not owned.
  ShardableModel* shardable = nullptr;
};

/// Builds a model with torch's current RNG (the caller seeds it); throws std::invalid_argument for
/// options the model cannot take.
using ImageModelFactory = ImageClassifier (*)(const ImageModelOptions& options);

struct ImageModelInfo {
  std::string_view name;    // --model
  ImageModelFactory value;  // the model's factory: what --model selects
  std::string_view help;
  /// The training options this model trains with unless given ("name = value" lines; empty: the
  /// image recipe's, which are MobileNetV2's).
  std::string_view defaults = {};
};

/// Every image model; the first is the default.
std::span<const ImageModelInfo> image_models();

}  // namespace mgbench::models
