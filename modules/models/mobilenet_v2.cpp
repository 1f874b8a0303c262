#include "models/mobilenet_v2.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "models/image_models.h"

namespace mgbench::models {
namespace {

namespace nn = torch::nn;

// t (expansion), c (output channels), n (repeats), s (stride of the first repeat): the paper's Table 2.
constexpr std::int64_t kSettings[7][4] = {{1, 16, 1, 1}, {6, 24, 2, 2},  {6, 32, 3, 2}, {6, 64, 4, 2},
                                          {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};

void init_weights(nn::Module& model) {
  // torchvision's initialisation. Not part of reset(): a clone overwrites the values anyway.
  torch::NoGradGuard no_grad;
  for (auto& m : model.modules(/*include_self=*/false)) {
    if (auto* conv = m->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut);
      if (conv->bias.defined()) nn::init::zeros_(conv->bias);
    } else if (auto* bn = m->as<nn::BatchNorm2d>()) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    } else if (auto* linear = m->as<nn::Linear>()) {
      nn::init::normal_(linear->weight, 0.0, 0.01);
      nn::init::zeros_(linear->bias);
    }
  }
}

}  // namespace

ConvBNReLU6Impl::ConvBNReLU6Impl(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride,
                                 std::int64_t groups)
    : in_(in), out_(out), kernel_(kernel), stride_(stride), groups_(groups) {
  reset();
}

void ConvBNReLU6Impl::reset() {
  conv = register_module("0", nn::Conv2d(nn::Conv2dOptions(in_, out_, kernel_)
                                             .stride(stride_)
                                             .padding((kernel_ - 1) / 2)
                                             .groups(groups_)
                                             .bias(false)));
  bn = register_module("1", nn::BatchNorm2d(out_));
  relu = register_module("2", nn::ReLU6(nn::ReLU6Options().inplace(true)));
}

std::int64_t make_divisible(double v, std::int64_t divisor) {
  std::int64_t new_v = std::max<std::int64_t>(
      divisor, static_cast<std::int64_t>(v + static_cast<double>(divisor) / 2.0) / divisor * divisor);
  if (static_cast<double>(new_v) < 0.9 * v) new_v += divisor;
  return new_v;
}

InvertedResidualImpl::InvertedResidualImpl(std::int64_t in_channels, std::int64_t out_channels, std::int64_t stride,
                                           std::int64_t expand_ratio)
    : in_(in_channels), out_(out_channels), stride_(stride), expand_(expand_ratio) {
  reset();
}

void InvertedResidualImpl::reset() {
  const auto hidden = static_cast<std::int64_t>(std::round(static_cast<double>(in_ * expand_)));
  conv_ = nn::Sequential();
  if (expand_ != 1) conv_->push_back(ConvBNReLU6(in_, hidden, 1, 1, 1));
  conv_->push_back(ConvBNReLU6(hidden, hidden, 3, stride_, hidden));
  conv_->push_back(nn::Conv2d(nn::Conv2dOptions(hidden, out_, 1).bias(false)));
  conv_->push_back(nn::BatchNorm2d(out_));
  register_module("conv", conv_);
}

torch::Tensor InvertedResidualImpl::forward(const torch::Tensor& x) {
  const bool residual = stride_ == 1 && in_ == out_;
  return residual ? x + conv_->forward(x) : conv_->forward(x);
}

MobileNetV2Impl::MobileNetV2Impl(const MobileNetV2Options& options) : ImageClassifierImpl(options) {
  if (!(options.width_mult > 0) || options.num_classes < 1 || options.dropout < 0 || options.dropout >= 1) {
    throw std::invalid_argument("MobileNetV2: width_mult > 0, num_classes >= 1 and dropout in [0, 1) required");
  }
  reset();
  init_weights(*this);
}

void MobileNetV2Impl::reset() {
  const auto& options = this->options();
  std::int64_t input_channel = make_divisible(32 * options.width_mult, options.round_nearest);
  const std::int64_t last_channel = make_divisible(1280 * std::max(1.0, options.width_mult), options.round_nearest);

  features_ = nn::Sequential();
  features_->push_back(ConvBNReLU6(3, input_channel, 3, 2, 1));
  for (const auto& s : kSettings) {
    const std::int64_t out = make_divisible(static_cast<double>(s[1]) * options.width_mult, options.round_nearest);
    for (std::int64_t i = 0; i < s[2]; ++i) {
      features_->push_back(InvertedResidual(input_channel, out, i == 0 ? s[3] : 1, s[0]));
      input_channel = out;
    }
  }
  features_->push_back(ConvBNReLU6(input_channel, last_channel, 1, 1, 1));
  register_module("features", features_);

  classifier_ = nn::Sequential(nn::Dropout(options.dropout), nn::Linear(last_channel, options.num_classes));
  register_module("classifier", classifier_);
}

torch::Tensor MobileNetV2Impl::forward(const torch::Tensor& input_images) {
  const torch::Tensor x = enter(0, input_images);  // the root: stem, last convolution, classifier
  torch::Tensor h;
  auto& stem = *(*features_)[0]->as<ConvBNReLU6Impl>();
  if (x.size(1) == 1) {
    h = stem.relu(stem.bn(stem_convolution(x, *stem.conv)));
  } else {
    h = stem.forward(x);
  }
  const int blocks = static_cast<int>(features_->size()) - 2;
  for (int unit = 1; unit <= blocks; ++unit)
    h = leave(unit, (*features_)[static_cast<std::size_t>(unit)]->as<InvertedResidualImpl>()->forward(enter(unit, h)));
  h = (*features_)[features_->size() - 1]->as<ConvBNReLU6Impl>()->forward(enter(0, h));
  h = torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1);
  return leave(0, classifier_->forward(h));
}

std::vector<ParameterUnit> MobileNetV2Impl::parameter_units() {
  std::vector<ParameterUnit> units;
  const std::size_t last = features_->size() - 1;
  ParameterUnit root{"root", {}, {}, {}, /*reshard_after_forward=*/false};
  add_parameters(root, *(*features_)[0], "features.0.");
  add_parameters(root, *(*features_)[last], fmt::format("features.{}.", last));
  add_parameters(root, *classifier_, "classifier.");
  units.push_back(std::move(root));
  for (std::size_t i = 1; i < last; ++i) {
    ParameterUnit block{fmt::format("features.{}", i), {}, {}, {}, true};
    add_parameters(block, *(*features_)[i], fmt::format("features.{}.", i));
    units.push_back(std::move(block));
  }
  return units;
}

std::shared_ptr<ImageClassifier> make_mobilenet_v2(const ImageModelOptions& o) {
  return make_image_classifier<MobileNetV2Impl>(MobileNetV2Options{o.num_classes, o.width_mult, o.dropout},
                                                o.freeze_batchnorm);
}

}  // namespace mgbench::models
