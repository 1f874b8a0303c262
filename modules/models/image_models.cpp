#include "models/image_models.h"

namespace mgbench::models {

// The models' factories, each in its model's file.
std::shared_ptr<ImageClassifier> make_mobilenet_v2(const ImageModelOptions& options);  // mobilenet_v2.cpp
std::shared_ptr<ImageClassifier> make_resnet50(const ImageModelOptions& options);      // resnet.cpp

namespace {

constexpr ImageModelInfo kImageModels[] = {
    {"mobilenet_v2", &make_mobilenet_v2,
     "MobileNetV2 (Sandler et al. 2018) as torchvision builds it; --width-mult scales its channels"},
    {"resnet50", &make_resnet50,
     "ResNet-50 (He et al. 2016) as torchvision builds it (v1.5: stride on the 3x3 convolution); no dropout "
     "(--dropout is ignored), --width-mult 1 only; unless given, --lr 0.1 --weight-decay 1e-4 (torchvision's "
     "ImageNet reference: SGD, momentum 0.9, 8 x 32 images a step)",
     "lr = 0.1\nweight-decay = 1e-4", 32, /*scales_width=*/false},
};

}  // namespace

std::span<const ImageModelInfo> image_models() { return kImageModels; }

}  // namespace mgbench::models
