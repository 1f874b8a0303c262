#include "models/mobilenet_v2.h"

#include <cmath>
#include <stdexcept>

namespace mgbench::models {
namespace {

namespace nn = torch::nn;

// t (expansion), c (output channels), n (repeats), s (stride of the first repeat): the paper's Table 2.
constexpr std::int64_t kSettings[7][4] = {{1, 16, 1, 1}, {6, 24, 2, 2},  {6, 32, 3, 2},  {6, 64, 4, 2},
                                          {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};

}  // namespace

ConvBNReLU6Impl::ConvBNReLU6Impl(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride,
                                 std::int64_t groups) {
  push_back(nn::Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding((kernel - 1) / 2).groups(groups).bias(false)));
  push_back(nn::BatchNorm2d(out));
  push_back(nn::ReLU6(nn::ReLU6Options().inplace(true)));
}

std::int64_t make_divisible(double v, std::int64_t divisor) {
  std::int64_t new_v = std::max<std::int64_t>(
      divisor, static_cast<std::int64_t>(v + static_cast<double>(divisor) / 2.0) / divisor * divisor);
  if (static_cast<double>(new_v) < 0.9 * v) new_v += divisor;
  return new_v;
}

InvertedResidualImpl::InvertedResidualImpl(std::int64_t in_channels, std::int64_t out_channels, std::int64_t stride,
                                           std::int64_t expand_ratio)
    : use_residual_(stride == 1 && in_channels == out_channels) {
  const auto hidden = static_cast<std::int64_t>(std::round(static_cast<double>(in_channels * expand_ratio)));
  conv_ = nn::Sequential();
  if (expand_ratio != 1) conv_->push_back(ConvBNReLU6(in_channels, hidden, 1, 1, 1));
  conv_->push_back(ConvBNReLU6(hidden, hidden, 3, stride, hidden));
  conv_->push_back(nn::Conv2d(nn::Conv2dOptions(hidden, out_channels, 1).bias(false)));
  conv_->push_back(nn::BatchNorm2d(out_channels));
  register_module("conv", conv_);
}

torch::Tensor InvertedResidualImpl::forward(const torch::Tensor& x) {
  return use_residual_ ? x + conv_->forward(x) : conv_->forward(x);
}

MobileNetV2Impl::MobileNetV2Impl(const MobileNetV2Options& options) : options_(options) {
  if (!(options.width_mult > 0) || options.num_classes < 1 || options.dropout < 0 || options.dropout >= 1) {
    throw std::invalid_argument("MobileNetV2: width_mult > 0, num_classes >= 1 and dropout in [0, 1) required");
  }
  std::int64_t input_channel = make_divisible(32 * options.width_mult, options.round_nearest);
  const std::int64_t last_channel = make_divisible(1280 * std::max(1.0, options.width_mult), options.round_nearest);

  features_ = nn::Sequential();
  stem_ = ConvBNReLU6(3, input_channel, 3, 2, 1);
  stem_conv_ = nn::Conv2d(std::dynamic_pointer_cast<nn::Conv2dImpl>(stem_->ptr(0)));
  features_->push_back(stem_);
  for (const auto& s : kSettings) {
    const std::int64_t out = make_divisible(static_cast<double>(s[1]) * options.width_mult, options.round_nearest);
    for (std::int64_t i = 0; i < s[2]; ++i) {
      InvertedResidual block(input_channel, out, i == 0 ? s[3] : 1, s[0]);
      features_->push_back(block);
      body_.emplace_back(block);
      input_channel = out;
    }
  }
  ConvBNReLU6 head(input_channel, last_channel, 1, 1, 1);
  features_->push_back(head);
  body_.emplace_back(head);
  register_module("features", features_);

  classifier_ = nn::Sequential(nn::Dropout(options.dropout), nn::Linear(last_channel, options.num_classes));
  register_module("classifier", classifier_);

  // torchvision's initialisation.
  torch::NoGradGuard no_grad;
  for (auto& m : modules(/*include_self=*/false)) {
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

torch::Tensor MobileNetV2Impl::forward(const torch::Tensor& x) {
  torch::Tensor h;
  if (x.size(1) == 1) {
    const auto& o = stem_conv_->options;
    h = torch::conv2d(x, stem_conv_->weight.sum(1, /*keepdim=*/true), /*bias=*/{}, o.stride(),
                      std::get<torch::ExpandingArray<2>>(o.padding()));
    // A 1-channel input and the channel-summed weight are layout-ambiguous, so the convolution
    // returns NCHW; continue in the layout of the model's weights (channels_last when converted),
    // otherwise every later convolution would reorder its input (measured: no NHWC speed-up).
    if (!stem_conv_->weight.is_contiguous() &&
        stem_conv_->weight.is_contiguous(torch::MemoryFormat::ChannelsLast)) {
      h = h.contiguous(torch::MemoryFormat::ChannelsLast);
    }
    h = (*stem_)[2]->as<nn::ReLU6>()->forward((*stem_)[1]->as<nn::BatchNorm2d>()->forward(h));
  } else {
    h = stem_->forward(x);
  }
  for (auto& block : body_) h = block.forward(h);
  h = torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1);
  return classifier_->forward(h);
}

void MobileNetV2Impl::set_batchnorm_frozen(bool frozen) {
  batchnorm_frozen_ = frozen;
  train(is_training());
}

void MobileNetV2Impl::train(bool on) {
  nn::Module::train(on);
  if (on && batchnorm_frozen_) {
    for (auto& m : modules(/*include_self=*/false)) {
      if (m->as<nn::BatchNorm2d>() != nullptr) m->eval();
    }
  }
}

}  // namespace mgbench::models
