#pragma once
// The image classifiers `mgbench image --model` can train: one row per model (name, factory, help),
// as nccl-tests' testColl descriptors. Adding a model: its file under models/ -- the module, an
// ImageClassifierImpl<Model> (models/image_classifier.h), and its factory -- and its row (and the
// factory's declaration) in image_models.cpp.
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include <torch/torch.h>

#include "models/image_classifier.h"

namespace mgbench::models {

struct ImageModelOptions {
  std::int64_t num_classes = 10;
  double width_mult = 1.0;        // channel width multiplier (MobileNetV2's)
  double dropout = 0.2;           // before the classifier
  bool freeze_batchnorm = false;  // BatchNorm stays in eval mode in train(): per-sample maths independent of the batch
};

/// Builds a model with torch's current RNG (the caller seeds it); throws std::invalid_argument for
/// options the model cannot take.
using ImageModelFactory = std::shared_ptr<ImageClassifier> (*)(const ImageModelOptions& options);

struct ImageModelInfo {
  std::string_view name;    // --model
  ImageModelFactory value;  // the model's factory: what --model selects
  std::string_view help;
  /// The training options this model trains with unless given ("name = value" lines; empty: the
  /// image recipe's, which are MobileNetV2's).
  std::string_view defaults = {};
  /// How much smaller the last feature map is than the input: five stride-2 stages (both models,
  /// as torchvision builds them), a side of s px ending as ceil(s / 32).
  std::int64_t output_stride = 32;
  /// Whether --width-mult scales the channels (MobileNetV2's) or only 1 is accepted (torchvision's
  /// ResNet has fixed widths).
  bool scales_width = true;
};

/// Every image model; the first is the default.
std::span<const ImageModelInfo> image_models();

}  // namespace mgbench::models
