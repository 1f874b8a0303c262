#include "models/image_models.h"

#include "models/mobilenet_v2.h"

namespace mgbench::models {
namespace {

ImageClassifier make_mobilenet_v2(const ImageModelOptions& o) {
  MobileNetV2 net(MobileNetV2Options{o.num_classes, o.width_mult, o.dropout});
  net->set_batchnorm_frozen(o.freeze_batchnorm);
  return {net.ptr(),
          [](torch::nn::Module& m, const torch::Tensor& x) { return static_cast<MobileNetV2Impl&>(m).forward(x); }};
}

constexpr ImageModelInfo kImageModels[] = {
    {"mobilenet_v2", ImageModel::kMobileNetV2,
     "MobileNetV2 (Sandler et al. 2018) as torchvision builds it; --width-mult scales its channels",
     &make_mobilenet_v2},
};

}  // namespace

std::span<const ImageModelInfo> image_models() { return kImageModels; }

}  // namespace mgbench::models
