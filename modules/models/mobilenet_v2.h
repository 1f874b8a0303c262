#pragma once
// MobileNetV2 (Sandler et al. 2018) with torchvision's architecture, initialisation and
// parameter names (torchvision/models/mobilenetv2.py), so torchvision state dicts load 1:1:
//   features.0 = Conv-BN-ReLU6 stem (3 -> 32 * width, stride 2), features.1..17 = inverted
//   residual blocks (features.i.conv.*), features.18 = 1x1 Conv-BN-ReLU6 to 1280 * max(1, width),
//   classifier.0 = Dropout, classifier.1 = Linear.
//
// Grayscale input: the stem keeps torchvision's 3 input channels. A 1-channel image x enters as
// if replicated into 3 channels: conv(repeat(x, 3), W) = conv(x, sum_c W[:, c]), which the stem
// computes directly (a third of the stem's input traffic and FLOPs, same result and gradients).
#include <cstdint>

#include <torch/torch.h>

#include "models/parameter_units.h"

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

class MobileNetV2Impl : public torch::nn::Cloneable<MobileNetV2Impl>, public ShardableModel {
 public:
  /// Throws std::invalid_argument for width_mult <= 0, num_classes < 1 or dropout outside [0, 1).
  explicit MobileNetV2Impl(const MobileNetV2Options& options = {});
  /// Builds the layers (Cloneable's contract); the constructor then applies torchvision's initialisation.
  void reset() override;

  /// x: [B, 1 or 3, H, W] (any H, W >= 1; the network downsamples by 32 before global pooling),
  /// dtype of the parameters. Returns logits [B, num_classes]. Activations follow the layout of
  /// the weights (see to_channels_last in state_dict.h).
  torch::Tensor forward(const torch::Tensor& x);

  /// Keeps the BatchNorm layers in eval mode (running statistics fixed, no batch statistics)
  /// even in train(): per-sample computation then no longer depends on the batch, which
  /// makes distributed runs comparable to single-rank runs exactly.
  void set_batchnorm_frozen(bool frozen);
  void train(bool on = true) override;

  const MobileNetV2Options& options() const { return options_; }

  /// FSDP units (train/parallel/fsdp.h), as FSDP2 wraps a CNN block by block: 0 the root -- the stem
  /// (features.0), the last 1x1 convolution (features.18) and the classifier, gathered before the
  /// stem and kept through backward (FSDP2 does not reshard the root after forward) -- then 1..17
  /// the inverted-residual blocks features.1..17. BatchNorm's buffers are not sharded.
  std::vector<ParameterUnit> parameter_units() override;
  void set_unit_hooks(UnitHooks* hooks) override { hooks_ = hooks; }

 private:
  void init_weights();

  MobileNetV2Options options_;
  UnitHooks* hooks_ = nullptr;  // not owned; copied by clone(), which --strategy dp (never sharded) uses
  torch::Tensor enter(int unit, const torch::Tensor& x) const { return hooks_ ? hooks_->before_forward(unit, x) : x; }
  torch::Tensor leave(int unit, const torch::Tensor& x) const { return hooks_ ? hooks_->after_forward(unit, x) : x; }
  // Layers are always reached through these registered children (never cached pointers into
  // them): cloning replaces the children's contents.
  torch::nn::Sequential features_{nullptr};    // 0: stem (conv_bn_relu6), 1..N-2: blocks, N-1: head
  torch::nn::Sequential classifier_{nullptr};  // 0: Dropout, 1: Linear
  bool batchnorm_frozen_ = false;
};
TORCH_MODULE(MobileNetV2);

}  // namespace mgbench::models
