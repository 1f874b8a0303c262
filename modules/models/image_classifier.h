#pragma once
// What every image classifier (`mgbench image --model`) shares -- torchvision's CNNs here,
// MobileNetV2 and ResNet-50 (torchvision/models/{mobilenetv2,resnet}.py): forward of images into
// logits, BatchNorm frozen on request, the FSDP unit hooks, the channels-last conversion, the
// grayscale stem and the deep copy --strategy dp runs.
//
// Two layers, because each model must derive from torch::nn::Cloneable<Model> (CRTP: clone(), which
// --strategy dp replicates with, needs the concrete type) and a second torch::nn::Module base would
// make a diamond:
// - ImageClassifier: the interface the recipe and DataParallel hold (not a Module: module() is the
//   network), with the shared state and helpers;
// - ImageClassifierImpl<Model, Options>: torch::nn::Cloneable<Model> + ImageClassifier, with
//   options(), module(), clone_classifier() and the train(bool) override, once for all.
// A model: `class XImpl : public ImageClassifierImpl<XImpl, XOptions>` with reset(), forward and
// parameter_units(), and a factory returning make_image_classifier<XImpl>(...) (models/image_models.h).
#include <memory>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "models/parameter_units.h"

namespace mgbench::models {

/// A classifier of images [B, 1 or 3, H, W] into logits [B, classes], shardable by FSDP. Its units
/// (parameter_units), as FSDP2 wraps a CNN block by block: 0 the root -- the stem and the head,
/// gathered before the stem and kept through backward (FSDP2 does not reshard the root after
/// forward) -- then one unit per block in forward order. BatchNorm's buffers are not sharded.
class ImageClassifier : public ShardableModel {
 public:
  /// x: [B, 1 or 3, H, W] (any H, W >= 1: the CNNs downsample by 32 before global pooling), dtype
  /// of the parameters, on their device. Returns logits [B, num_classes]. Activations follow the
  /// layout of the weights (to_channels_last).
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;

  /// The network as a torch module -- this same object -- for its parameters, buffers, modes and
  /// device moves. Made by std::make_shared (make_image_classifier), so shared_from_this() works.
  virtual torch::nn::Module& module() = 0;

  /// A deep copy (torch::nn::Cloneable::clone), its tensors moved to `device` if given: a replica of
  /// --strategy dp. Shares the unit hooks and the frozen-BatchNorm setting; draws from the CPU RNG
  /// (clone re-runs reset()).
  virtual std::shared_ptr<ImageClassifier> clone_classifier(
      const std::optional<torch::Device>& device = std::nullopt) const = 0;

  /// Keeps the BatchNorm layers in eval mode (running statistics fixed, no batch statistics)
  /// even in train(): per-sample computation then no longer depends on the batch, which makes
  /// distributed runs comparable to single-rank runs exactly. Applies to the current mode at once.
  void set_batchnorm_frozen(bool frozen);

  /// Converts the convolution weights to channels_last (NHWC) in place (models::to_channels_last in
  /// state_dict.h); forward then computes NHWC, the 1-channel stem included.
  void to_channels_last();

  void set_unit_hooks(UnitHooks* hooks) override { hooks_ = hooks; }

 protected:
  /// train(bool)'s second half, after Module::train(on): BatchNorm layers back to eval when frozen.
  void keep_batchnorm_frozen(bool on);

  /// Around unit `unit`'s forward (ShardableModel): the hooks', or x itself without hooks.
  torch::Tensor enter(int unit, const torch::Tensor& x) const { return hooks_ ? hooks_->before_forward(unit, x) : x; }
  torch::Tensor leave(int unit, const torch::Tensor& x) const { return hooks_ ? hooks_->after_forward(unit, x) : x; }

  /// Appends module's parameters to unit, named prefix + their name (parameter_units' building step).
  static void add_parameters(ParameterUnit& unit, const torch::nn::Module& module, const std::string& prefix);

  /// The stem's convolution (no bias, groups 1) of x [B, 1 or 3, H, W] with conv's weight
  /// [C, 3, kH, kW]. The stem keeps torchvision's 3 input channels; a 1-channel x enters as if
  /// replicated into 3: conv(repeat(x, 3), W) = conv(x, sum_c W[:, c]), computed directly (a third
  /// of the input traffic and FLOPs, same result and gradients), NHWC when the weight is.
  static torch::Tensor stem_convolution(const torch::Tensor& x, const torch::nn::Conv2dImpl& conv);

 private:
  UnitHooks* hooks_ = nullptr;  // not owned; copied by clone(), which --strategy dp (never sharded) uses
  bool batchnorm_frozen_ = false;
};

/// The Module half of a model: Cloneable<Model> joined to the interface, holding Model's options.
/// Model supplies reset() (builds the layers: Cloneable's contract, run again by clone()), forward
/// and parameter_units(); its constructor checks the options, calls reset(), then initialises the
/// weights as torchvision does (not in reset(): a clone overwrites the values anyway).
template <class Model, class Options>
class ImageClassifierImpl : public torch::nn::Cloneable<Model>, public ImageClassifier {
 public:
  const Options& options() const { return options_; }

  torch::nn::Module& module() override { return *this; }

  std::shared_ptr<ImageClassifier> clone_classifier(
      const std::optional<torch::Device>& device = std::nullopt) const override {
    return std::static_pointer_cast<Model>(this->clone(device));
  }

  /// Module::train, with the BatchNorm layers kept in eval mode when frozen (set_batchnorm_frozen).
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    keep_batchnorm_frozen(on);
  }

 protected:
  explicit ImageClassifierImpl(const Options& options) : options_(options) {}

 private:
  Options options_;
};

/// A model's factory's body: Model built from its options (torch's current RNG), BatchNorm frozen or
/// not. Throws what Model's constructor throws (std::invalid_argument for options it cannot take).
template <class Model, class Options>
std::shared_ptr<ImageClassifier> make_image_classifier(const Options& options, bool freeze_batchnorm) {
  auto model = std::make_shared<Model>(options);
  model->set_batchnorm_frozen(freeze_batchnorm);
  return model;
}

}  // namespace mgbench::models
