#include "data/image_dataset.h"

#include <array>

#include "data/device_decode.h"
#include "data/transforms.h"

namespace mgbench::data {
namespace {

constexpr std::array<double, 1> kMnistMeans = {kMnistMean};
constexpr std::array<double, 1> kMnistStds = {kMnistStd};

class MnistDataset final : public ImageDataset {
 public:
  explicit MnistDataset(MnistSplit split) : split_(std::move(split)) {}
  std::int64_t size() const override { return split_.size(); }
  std::int64_t num_classes() const override { return kMnistClasses; }
  std::int64_t image_size() const override { return split_.rows; }
  Batch assemble(const PlannedBatch& plan, bool pin_memory) const override {
    Batch batch = assemble_mnist_batch(split_, plan.indices, pin_memory);
    batch.plan = plan;
    return batch;
  }
  std::span<const double> mean() const override { return kMnistMeans; }
  std::span<const double> std() const override { return kMnistStds; }
  std::string path() const override { return split_.images_path; }

 private:
  MnistSplit split_;
};

class EncodedDataset final : public ImageDataset {
 public:
  EncodedDataset(EncodedImages images, ImageTransform transform, int threads, bool skip_bad,
                 std::optional<NvjpegBackend> device_decode)
      : images_(std::move(images)),
        transform_(transform),
        threads_(threads),
        skip_bad_(skip_bad),
        device_decode_(device_decode) {}
  std::int64_t size() const override { return images_.size(); }
  std::int64_t num_classes() const override { return static_cast<std::int64_t>(images_.classes.size()); }
  std::int64_t image_size() const override { return transform_.size; }
  Batch assemble(const PlannedBatch& plan, bool pin_memory) const override {
    if (device_decode_) return assemble_encoded_bytes(images_, plan, transform_, threads_);
    return assemble_encoded_batch(images_, plan, transform_, threads_, pin_memory, skip_bad_);
  }
  torch::Tensor decode_on_device(const Batch& batch, const torch::Device& device,
                                 torch::ScalarType dtype) const override {
    if (!device_decode_) return {};
    return decode_and_crop_on_device(batch, *device_decode_, transform_.size, device, dtype, kImageNetMean,
                                     kImageNetStd);
  }
  std::span<const double> mean() const override { return kImageNetMean; }
  std::span<const double> std() const override { return kImageNetStd; }
  std::string path() const override { return images_.root; }
  std::vector<std::int64_t> shard_sizes() const override { return images_.shard_sizes; }

 private:
  EncodedImages images_;
  ImageTransform transform_;
  int threads_;
  bool skip_bad_;
  std::optional<NvjpegBackend> device_decode_;
};

}  // namespace

std::unique_ptr<ImageDataset> make_mnist_dataset(MnistSplit split) {
  return std::make_unique<MnistDataset>(std::move(split));
}

std::unique_ptr<ImageDataset> make_encoded_dataset(EncodedImages images, ImageTransform transform, int threads,
                                                   bool skip_bad, std::optional<NvjpegBackend> device_decode) {
  return std::make_unique<EncodedDataset>(std::move(images), transform, threads, skip_bad, device_decode);
}

}  // namespace mgbench::data
