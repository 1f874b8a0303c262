#include "models/image_classifier.h"

#include "models/state_dict.h"

namespace mgbench::models {
namespace {

// A contiguous [N, 1, H, W] tensor viewed with channels_last strides (H*W, 1, W, 1): the same bytes.
torch::Tensor single_channel_as_channels_last(const torch::Tensor& t) {
  return t.as_strided(t.sizes(), {t.size(2) * t.size(3), 1, t.size(3), 1});
}

}  // namespace

void ImageClassifier::set_batchnorm_frozen(bool frozen) {
  batchnorm_frozen_ = frozen;
  module().train(module().is_training());
}

void ImageClassifier::to_channels_last() { models::to_channels_last(module()); }

void ImageClassifier::keep_batchnorm_frozen(bool on) {
  if (!on || !batchnorm_frozen_) return;
  for (auto& m : module().modules(/*include_self=*/false)) {
    if (m->as<torch::nn::BatchNorm2d>() != nullptr) m->eval();
  }
}

void ImageClassifier::add_parameters(ParameterUnit& unit, const torch::nn::Module& module, const std::string& prefix) {
  for (const auto& item : module.named_parameters()) {
    unit.names.push_back(prefix + item.key());
    unit.parameters.push_back(item.value());
  }
}

torch::Tensor ImageClassifier::stem_convolution(const torch::Tensor& x, const torch::nn::Conv2dImpl& conv) {
  torch::Tensor input = x;
  torch::Tensor weight = conv.weight;
  if (x.size(1) == 1) {
    weight = weight.sum(1, /*keepdim=*/true);
    // A 1-channel tensor is contiguous in both layouts, and PyTorch reads NCHW strides as NCHW: the
    // convolution then runs oneDNN's im2col + GEMM path and returns NCHW. In a channels_last model,
    // give input and weight channels_last strides (the same bytes): oneDNN's direct NHWC kernel,
    // 4x faster at 64 px (forward + backward), and an NHWC output for the later convolutions.
    if (!conv.weight.is_contiguous() && conv.weight.is_contiguous(torch::MemoryFormat::ChannelsLast)) {
      input = single_channel_as_channels_last(x.contiguous());
      weight = single_channel_as_channels_last(weight.contiguous());
    }
  }
  const auto& o = conv.options;
  return torch::conv2d(input, weight, /*bias=*/{}, o.stride(), std::get<torch::ExpandingArray<2>>(o.padding()));
}

}  // namespace mgbench::models
