#pragma once
// ResNet-50 (He et al. 2016, "Deep Residual Learning for Image Recognition") with torchvision's
// architecture, initialisation and parameter names (torchvision/models/resnet.py, resnet50), so
// torchvision state dicts load 1:1:
//   conv1 (7x7, 3 -> 64, stride 2) - bn1 - ReLU - max pool (3x3, stride 2)
//   layer1..layer4: 3, 4, 6, 3 Bottleneck blocks of 64, 128, 256, 512 planes (output 4x planes);
//     layerN.i.{conv1 (1x1), bn1, conv2 (3x3), bn2, conv3 (1x1), bn3}, and in each stage's first
//     block layerN.0.downsample.{0 (1x1 conv, the block's stride), 1 (BatchNorm2d)}
//   global average pool - fc (Linear 2048 -> num_classes).
// ResNet "v1.5" as torchvision: a block's stride is on its 3x3 conv2, not on conv1 as in the paper.
// torchvision's defaults: zero_init_residual=False, groups 1, width 64, no dilation. Initialisation:
// convolutions kaiming_normal_(fan_out, relu), BatchNorm weight 1 and bias 0, fc torch.nn.Linear's
// own (kaiming_uniform_(a = sqrt(5)), bias uniform(+-1 / sqrt(2048))); the modules are created and
// drawn in torchvision's order, so the same seed gives torchvision's weights bit for bit (tested).
// Every BatchNorm2d has its num_batches_tracked buffer (int64), as in torchvision's state dict.
// 25,557,032 parameters with 1000 classes; 23,528,522 with 10.
// An ImageClassifier (models/image_classifier.h): grayscale input through the stem's summed weight,
// frozen BatchNorm, FSDP unit hooks and channels-last come from there, as for MobileNetV2.
//
// ResNet-50 has no dropout and no width multiplier: its factory (`--model resnet50`) ignores
// --dropout and refuses --width-mult other than 1.
#include <array>
#include <cstdint>

#include <torch/torch.h>

#include "models/image_classifier.h"

namespace mgbench::models {

struct ResNetOptions {
  std::int64_t num_classes = 10;
  /// Bottleneck blocks per stage: ResNet-50's (torchvision's resnet101: 3, 4, 23, 3; resnet152:
  /// 3, 8, 36, 3).
  std::array<std::int64_t, 4> blocks = {3, 4, 6, 3};
};

// The modules are Cloneable (module->clone(device) deep-copies them), which data parallelism
// (torch::nn::parallel::replicate, train/recipes/data_parallel.h) needs.

/// torchvision's Bottleneck (expansion 4): 1x1 conv to `planes`, 3x3 conv with the stride, 1x1 conv
/// to 4 * planes, each followed by BatchNorm, ReLU after the first two and after the residual sum.
/// The shortcut is `downsample` (1x1 conv with the stride + BatchNorm) where the shape changes.
class BottleneckImpl : public torch::nn::Cloneable<BottleneckImpl> {
 public:
  static constexpr std::int64_t kExpansion = 4;
  BottleneckImpl(std::int64_t in_channels, std::int64_t planes, std::int64_t stride);
  void reset() override;
  /// x: [B, in_channels, H, W] -> [B, 4 * planes, ceil(H / stride), ceil(W / stride)].
  torch::Tensor forward(const torch::Tensor& x);

  // Leaf children: cloning assigns their contents in place, so these handles stay valid.
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Sequential downsample{nullptr};  // 0: Conv2d 1x1, 1: BatchNorm2d; null where the shape stays

 private:
  std::int64_t in_, planes_, stride_;
};
TORCH_MODULE(Bottleneck);

class ResNetImpl : public ImageClassifierImpl<ResNetImpl, ResNetOptions> {
 public:
  /// Throws std::invalid_argument for num_classes < 1 or a stage without blocks.
  explicit ResNetImpl(const ResNetOptions& options = {});
  void reset() override;  // builds conv1, bn1, layer1..4 and fc, in torchvision's order
  torch::Tensor forward(const torch::Tensor& x) override;

  /// FSDP units (train/parallel/fsdp.h), as ImageClassifier says: 0 the root -- the stem (conv1, bn1)
  /// and fc -- then one unit per Bottleneck block in forward order (layer1.0 .. layer4.2: 16 for
  /// ResNet-50).
  std::vector<ParameterUnit> parameter_units() override;

 private:
  torch::Tensor stem(const torch::Tensor& x);

  // Layers are always reached through these registered children (never cached pointers into
  // their elements): cloning replaces the children's contents.
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr};
  std::array<torch::nn::Sequential, 4> layers_{nullptr, nullptr, nullptr, nullptr};  // "layer1".."layer4"
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(ResNet);

}  // namespace mgbench::models
