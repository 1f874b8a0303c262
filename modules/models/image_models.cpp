#include "models/image_models.h"

namespace mgbench::models {

// The models' factories, each in its model's file.
ImageClassifier make_mobilenet_v2(const ImageModelOptions& options);  // mobilenet_v2.cpp

namespace {

constexpr ImageModelInfo kImageModels[] = {
    {"mobilenet_v2", &make_mobilenet_v2,
     "MobileNetV2 (Sandler et al. 2018) as torchvision builds it; --width-mult scales its channels"},
};

}  // namespace

std::span<const ImageModelInfo> image_models() { return kImageModels; }

}  // namespace mgbench::models
