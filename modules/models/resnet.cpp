#include "models/resnet.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "models/image_models.h"

namespace mgbench::models {
namespace {

namespace nn = torch::nn;

constexpr std::int64_t kStemChannels = 64;
constexpr std::array<std::int64_t, 4> kStagePlanes = {64, 128, 256, 512};

// torchvision's conv1x1 / conv3x3: no bias, padding 1 for the 3x3.
nn::Conv2d conv(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

void init_weights(nn::Module& model) {
  // torchvision's initialisation, over modules() in registration order as torchvision's loop; the
  // Linear keeps its default initialisation. Not part of reset(): a clone overwrites the values anyway.
  torch::NoGradGuard no_grad;
  for (auto& m : model.modules(/*include_self=*/false)) {
    if (auto* c = m->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(c->weight, /*a=*/0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = m->as<nn::BatchNorm2d>()) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    }
  }
}

}  // namespace

BottleneckImpl::BottleneckImpl(std::int64_t in_channels, std::int64_t planes, std::int64_t stride)
    : in_(in_channels), planes_(planes), stride_(stride) {
  reset();
}

void BottleneckImpl::reset() {
  // Registered in torchvision's order (its state dict's and named_parameters()' order).
  const std::int64_t out = planes_ * kExpansion;
  conv1 = register_module("conv1", conv(in_, planes_, 1, 1));
  bn1 = register_module("bn1", nn::BatchNorm2d(planes_));
  conv2 = register_module("conv2", conv(planes_, planes_, 3, stride_));
  bn2 = register_module("bn2", nn::BatchNorm2d(planes_));
  conv3 = register_module("conv3", conv(planes_, out, 1, 1));
  bn3 = register_module("bn3", nn::BatchNorm2d(out));
  if (stride_ != 1 || in_ != out) {
    downsample = register_module("downsample", nn::Sequential(conv(in_, out, 1, stride_), nn::BatchNorm2d(out)));
  }
}

torch::Tensor BottleneckImpl::forward(const torch::Tensor& x) {
  // In place where torchvision is (ReLU(inplace=True), out += identity): x itself is never written.
  torch::Tensor out = bn1(conv1(x)).relu_();
  out = bn2(conv2(out)).relu_();
  out = bn3(conv3(out));
  out += downsample ? downsample->forward(x) : x;
  return torch::relu_(out);
}

ResNetImpl::ResNetImpl(const ResNetOptions& options) : ImageClassifierImpl(options) {
  const bool empty_stage = std::any_of(options.blocks.begin(), options.blocks.end(), [](auto n) { return n < 1; });
  if (options.num_classes < 1 || empty_stage) {
    throw std::invalid_argument("ResNet: num_classes >= 1 and at least one block per stage required");
  }
  reset();
  init_weights(*this);
}

void ResNetImpl::reset() {
  conv1_ =
      register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, kStemChannels, 7).stride(2).padding(3).bias(false)));
  bn1_ = register_module("bn1", nn::BatchNorm2d(kStemChannels));
  std::int64_t channels = kStemChannels;
  for (std::size_t stage = 0; stage < layers_.size(); ++stage) {
    const std::int64_t planes = kStagePlanes[stage];
    layers_[stage] = nn::Sequential();
    for (std::int64_t i = 0; i < options().blocks[stage]; ++i) {
      const std::int64_t stride = (stage > 0 && i == 0) ? 2 : 1;
      layers_[stage]->push_back(Bottleneck(channels, planes, stride));
      channels = planes * BottleneckImpl::kExpansion;
    }
    register_module(fmt::format("layer{}", stage + 1), layers_[stage]);
  }
  fc_ = register_module("fc", nn::Linear(channels, options().num_classes));
}

torch::Tensor ResNetImpl::stem(const torch::Tensor& x) {
  torch::Tensor h = bn1_(stem_convolution(x, *conv1_)).relu_();
  return torch::max_pool2d(h, /*kernel_size=*/3, /*stride=*/2, /*padding=*/1);
}

torch::Tensor ResNetImpl::forward(const torch::Tensor& input_images) {
  torch::Tensor h = stem(enter(0, input_images));  // the root: stem and fc
  int unit = 0;
  for (const auto& layer : layers_) {
    for (std::size_t i = 0; i < layer->size(); ++i) {
      ++unit;
      h = leave(unit, (*layer)[i]->as<BottleneckImpl>()->forward(enter(unit, h)));
    }
  }
  h = torch::adaptive_avg_pool2d(enter(0, h), {1, 1}).flatten(1);
  return leave(0, fc_(h));
}

std::vector<ParameterUnit> ResNetImpl::parameter_units() {
  std::vector<ParameterUnit> units;
  ParameterUnit root{"root", {}, {}, {}, /*reshard_after_forward=*/false};
  add_parameters(root, *conv1_, "conv1.");
  add_parameters(root, *bn1_, "bn1.");
  add_parameters(root, *fc_, "fc.");
  units.push_back(std::move(root));
  for (std::size_t stage = 0; stage < layers_.size(); ++stage) {
    for (std::size_t i = 0; i < layers_[stage]->size(); ++i) {
      const std::string name = fmt::format("layer{}.{}", stage + 1, i);
      ParameterUnit block{name, {}, {}, {}, true};
      add_parameters(block, *(*layers_[stage])[i], name + ".");
      units.push_back(std::move(block));
    }
  }
  return units;
}

std::shared_ptr<ImageClassifier> make_resnet50(const ImageModelOptions& o) {
  if (o.width_mult != 1.0) {
    throw std::invalid_argument(
        fmt::format("--width-mult {}: resnet50 has torchvision's fixed widths; only 1 is accepted", o.width_mult));
  }
  // o.dropout is ignored: torchvision's ResNet has no dropout (the image recipe always passes one).
  return make_image_classifier<ResNetImpl>(ResNetOptions{o.num_classes}, o.freeze_batchnorm);
}

}  // namespace mgbench::models
