#pragma once
// MobileNetV2 (Sandler et al. 2018) with torchvision's architecture, initialisation and
// parameter names (torchvision/models/mobilenetv2.py), so torchvision state dicts load 1:1:
//   features.0 = Conv-BN-ReLU6 stem (3 -> 32 * width, stride 2), features.1..17 = inverted
//   residual blocks (features.i.conv.*), features.18 = 1x1 Conv-BN-ReLU6 to 1280 * max(1, width),
//   classifier.0 = Dropout, classifier.1 = Linear.
// An ImageClassifier (models/image_classifier.h): grayscale input through the stem's summed weight,
// frozen BatchNorm, FSDP unit hooks and channels-last come from there.
#include <cstdint>

#include <torch/torch.h>

#include "models/image_classifier.h"

namespace mgbench::models {

struct MobileNetV2Options {
  std::int64_t num_classes = 10;
  double width_mult = 1.0;
  double dropout = 0.2;  // torchvision's default
  std::int64_t round_nearest = 8;
};

/// torchvision's _make_divisible: v rounded to a multiple of divisor, never more than 10 % below v.
std::int64_t make_divisible(double v, std::int64_t divisor);

// The modules are Cloneable (module->clone(device) deep-copies them), which data parallelism
// (torch::nn::parallel::replicate, train/recipes/data_parallel.h) needs.

/// torchvision.ops.Conv2dNormActivation with BatchNorm2d and ReLU6: children "0" (Conv2d, no
/// bias, padding (kernel - 1) / 2), "1" (BatchNorm2d), "2" (ReLU6), as torchvision names them.
class ConvBNReLU6Impl : public torch::nn::Cloneable<ConvBNReLU6Impl> {
 public:
  ConvBNReLU6Impl(std::int64_t in_channels, std::int64_t out_channels, std::int64_t kernel, std::int64_t stride,
                  std::int64_t groups);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x) { return relu(bn(conv(x))); }

  // Leaf children: cloning assigns their contents in place, so these handles stay valid.
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::ReLU6 relu{nullptr};

 private:
  std::int64_t in_, out_, kernel_, stride_, groups_;
};
TORCH_MODULE(ConvBNReLU6);

class InvertedResidualImpl : public torch::nn::Cloneable<InvertedResidualImpl> {
 public:
  InvertedResidualImpl(std::int64_t in_channels, std::int64_t out_channels, std::int64_t stride,
                       std::int64_t expand_ratio);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);

 private:
  std::int64_t in_, out_, stride_, expand_;
  torch::nn::Sequential conv_{nullptr};
};
TORCH_MODULE(InvertedResidual);

class MobileNetV2Impl : public ImageClassifierImpl<MobileNetV2Impl, MobileNetV2Options> {
 public:
  /// Throws std::invalid_argument for width_mult <= 0, num_classes < 1 or dropout outside [0, 1).
  explicit MobileNetV2Impl(const MobileNetV2Options& options = {});
  void reset() override;  // builds features (stem, inverted-residual blocks, last 1x1 convolution), classifier
  torch::Tensor forward(const torch::Tensor& x) override;

  /// FSDP units (train/parallel/fsdp.h), as ImageClassifier says: 0 the root -- the stem (features.0),
  /// the last 1x1 convolution (features.18) and the classifier -- then 1..17 the inverted-residual
  /// blocks features.1..17.
  std::vector<ParameterUnit> parameter_units() override;

 private:
  // Layers are always reached through these registered children (never cached pointers into
  // them): cloning replaces the children's contents.
  torch::nn::Sequential features_{nullptr};    // 0: stem (conv_bn_relu6), 1..N-2: blocks, N-1: head
  torch::nn::Sequential classifier_{nullptr};  // 0: Dropout, 1: Linear
};
TORCH_MODULE(MobileNetV2);

}  // namespace mgbench::models
