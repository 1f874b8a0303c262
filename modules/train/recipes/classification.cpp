// The image classification recipe (Lawenda et al. 2025, sec. 3): an image model (MobileNetV2,
// ResNet-50) trained on MNIST-format data upscaled to --image-size, or on JPEG / PNG files (an
// ImageFolder tree: the second paper's natively sized images) decoded and cropped on the loader's
// threads; cross-entropy averaged over the batch, test accuracy after every --eval-every epochs.
//
// uint8 images cross PCIe (MNIST: 28 x 28, 784 + 8 bytes per sample; files: S x S x 3 after the
// crop) and are normalised (and MNIST upscaled) on the device (--upscale device), or, as the
// paper's DataLoader does, on the loader thread before the copy (--upscale host: float S x S
// images cross PCIe). --strategy dp trains one process over every visible GPU of the node
// (train/recipes/data_parallel.h).
#include <optional>

#include <fmt/format.h>

#include <filesystem>
#include "core/error.h"
#include "core/log.h"

#include "data/device_decode.h"
#include "data/image_dataset.h"
#include "data/loader.h"
#include "data/mnist.h"
#include "data/transforms.h"
#include "models/image_models.h"
#include "models/state_dict.h"
#include "runtime/scalar_type.h"
#include "train/recipe.h"
#include "train/recipes/data_parallel.h"

namespace mgbench::train {
namespace {

enum class Upscale { kDevice, kHost };

constexpr options::Choice<Upscale> kUpscales[] = {
    {"device", Upscale::kDevice, "uint8 images cross PCIe, normalised (and MNIST's upscaled) on the device"},
    {"host", Upscale::kHost, "the paper's DataLoader: the loader thread normalises, float S x S images cross PCIe"},
};

enum class DatasetKind { kMnist, kImageFolder, kWebDataset };

enum class Decode { kHost, kDevice };

constexpr options::Choice<Decode> kDecodes[] = {
    {"host", Decode::kHost, "TurboJPEG / libspng on the loader's threads; uint8 crops cross PCIe"},
    {"device", Decode::kDevice,
     "nvJPEG on the GPU (the papers' DALI comparison): the files' bytes cross PCIe, crops drawn on the host"},
};

constexpr options::Choice<data::NvjpegBackend> kNvjpegBackends[] = {
    {"auto", data::NvjpegBackend::kAuto, "the JPEG engines where the GPU has them (A100, H100, H200), else gpu-hybrid"},
    {"hardware", data::NvjpegBackend::kHardware,
     "batches on the GPU's JPEG engines (DALI's default there); progressive JPEGs per image"},
    {"gpu-hybrid", data::NvjpegBackend::kGpuHybrid, "batches, Huffman decoding on the GPU's SMs"},
    {"hybrid", data::NvjpegBackend::kHybrid, "per image, Huffman decoding on a CPU core (the feeder's thread)"},
};

constexpr options::Choice<DatasetKind> kDatasets[] = {
    {"mnist", DatasetKind::kMnist, "MNIST-format IDX files (MNIST, Fashion-MNIST), upscaled to --image-size"},
    {"imagefolder", DatasetKind::kImageFolder,
     "JPEG / PNG files in DATA/train/<class>/ and DATA/val/<class>/ (torchvision's ImageFolder)"},
    {"webdataset", DatasetKind::kWebDataset,
     "tar shards DATA/train/*.tar and DATA/val/*.tar of <key>.jpg|png + <key>.cls; ddp-ds gives each rank whole "
     "shards"},
};

constexpr options::Choice<data::ImageTransform::Kind> kCrops[] = {
    {"random", data::ImageTransform::Kind::kRandomResizedCrop,
     "RandomResizedCrop(S) + RandomHorizontalFlip, as torchvision's ImageNet training"},
    {"center", data::ImageTransform::Kind::kCenter,
     "Resize(S) of the shorter side + CenterCrop(S): files already S x S pass unchanged (native size)"},
};

/// --image-size native, until the dataset gives the size.
constexpr std::int64_t kNativeImageSize = 0;

struct ImageOptions {
  DatasetKind dataset = DatasetKind::kMnist;
  std::string data_dir = "inputs/mnist";
  data::ImageTransform::Kind crop = data::ImageTransform::Kind::kRandomResizedCrop;
  int loader_threads = 4;
  bool skip_bad_images = false;
  Decode decode = Decode::kHost;
  data::NvjpegBackend nvjpeg_backend = data::NvjpegBackend::kAuto;
  std::int64_t image_size = 100;  // px, square; the paper used 100-700; kNativeImageSize until resolved
  std::int64_t limit_train = 0;   // 0: all training samples
  std::int64_t limit_test = 0;    // 0: all test samples
  Upscale upscale = Upscale::kDevice;
  models::ImageModelFactory model = models::image_models().front().value;
  double width_mult = 1.0;
  double dropout = 0.2;
  bool freeze_batchnorm = false;
  bool channels_last = true;  // NHWC activations and conv weights (oneDNN on CPU, tensor cores on GPU)
};

class ClassificationRecipe final : public Recipe {
 public:
  void declare(options::OptionTable& t) override {
    auto& o = options_;
    t.section("Data");
    t.add("dataset", o.dataset, std::span<const options::Choice<DatasetKind>>(kDatasets), "the dataset's format");
    t.add("data", o.data_dir,
          "mnist: directory with IDX files (train-images-idx3-ubyte[.gz], t10k-...); imagefolder: directory with "
          "train/ and val/ class folders; webdataset: directory with train/ and val/ tar shards")
        .same_workload();
    t.add("image-size", o.image_size,
          "side of the square images the model sees [px] (the papers: 100-700); native: the files' own size (the "
          "shorter side of the first training image; MNIST 28), every image resized and cropped to it as --crop says")
        .at_least(1)
        .at_most(4096)
        .named_value("native", kNativeImageSize);
    t.add("limit-train", o.limit_train, "use the first N training images (0: all)").at_least(0);
    t.add("limit-test", o.limit_test, "use the first N test images (0: all)").at_least(0);
    t.add("upscale", o.upscale, std::span<const options::Choice<Upscale>>(kUpscales),
          "where the images are normalised (and MNIST's upscaled)");
    // MNIST is upscaled whole, on the device or the host (--upscale): no files, no crops.
    const auto image_files = [&o] { return o.dataset != DatasetKind::kMnist; };
    const std::string of_image_files = "--dataset imagefolder or webdataset";
    t.add("crop", o.crop, std::span<const options::Choice<data::ImageTransform::Kind>>(kCrops),
          "imagefolder, webdataset: the training crop on the host (evaluation: Resize(S) + CenterCrop(S))")
        .only_with(image_files, of_image_files);
    t.add("loader-threads", o.loader_threads, "imagefolder, webdataset: threads per rank decoding and cropping a batch")
        .at_least(1)
        .at_most(256)
        .same_workload()
        .only_with(image_files, of_image_files);
    t.add("decode", o.decode, std::span<const options::Choice<Decode>>(kDecodes),
          "imagefolder, webdataset: where JPEG files are decoded (PNG and CMYK JPEG: always on the host)")
        .only_with(image_files, of_image_files);
    t.add("nvjpeg-backend", o.nvjpeg_backend, std::span<const options::Choice<data::NvjpegBackend>>(kNvjpegBackends),
          "--decode device: how nvJPEG decodes")
        .only_with([&o] { return o.decode == Decode::kDevice; }, "--decode device");
    t.add("skip-bad-images", o.skip_bad_images,
          "imagefolder, webdataset: a file that cannot be decoded is named in a warning and replaced by another "
          "image of its batch, counted in the epochs' skipped_images (default: the job stops, naming it)")
        .same_workload()
        .only_with(image_files, of_image_files);
    t.section("Model");
    t.add("model", o.model, models::image_models(), "the image classifier");
    t.add("width-mult", o.width_mult, "channel width multiplier").above(0).at_most(4);
    t.add("dropout", o.dropout, "dropout before the classifier").at_least(0).below(1).same_workload();
    t.add("freeze-batchnorm", o.freeze_batchnorm,
          "keep BatchNorm in eval mode while training (per-sample maths independent of the batch)")
        .same_workload();
    t.add("channels-last", o.channels_last, "NHWC memory layout of activations and conv weights");
  }

  void resolve_defaults(options::OptionTable& table) const override {
    table.set_defaults(options::row_of(models::image_models(), options_.model).defaults);
  }

  // --sharding fsdp shards the model's units (MobileNetV2's inverted-residual blocks and its root).
  void validate(const TrainOptions&) const override {
    const models::ImageModelInfo& model = options::row_of(models::image_models(), options_.model);
    MGBENCH_REQUIRE(model.scales_width || options_.width_mult == 1.0, ConfigError,
                    "--width-mult {}: {} has torchvision's fixed widths; only 1 is accepted", options_.width_mult,
                    model.name);
  }

  void setup(const RecipeContext& ctx) override {
    const auto& o = options_;
    dtype_ = runtime::scalar_type(ctx.precision.param_dtype);
    device_ = ctx.device;
    if (o.decode == Decode::kDevice) {
      data::resolve_nvjpeg_backend(o.nvjpeg_backend, ctx.device);  // refuses a CPU, or what this build or GPU lacks
      MGBENCH_REQUIRE(o.upscale == Upscale::kDevice && !o.skip_bad_images, ConfigError,
                      "--decode device works with --upscale device and without --skip-bad-images");
    }
    load_datasets(ctx.train.seed);
    model_ = o.model({train_set_->num_classes(), o.width_mult, o.dropout, o.freeze_batchnorm});
    models::to_device(model_->module(), ctx.device, dtype_);
    if (o.channels_last) model_->to_channels_last();
    if (ctx.train.strategy == axes::Strategy::kDp) {
      // One process over every visible GPU of the node, the model on the rank's GPU first.
      std::vector<torch::Device> devices{ctx.device};
      if (ctx.device.is_cuda()) {
        for (int i = 0; i < runtime::visible_cuda_devices(); ++i) {
          if (i != ctx.device.index()) devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
        }
      }
      dp_.emplace(model_, devices);
      log::info("data parallel over {} device(s)", devices.size());
    }
  }

  std::int64_t train_size() const override { return train_set_->size(); }
  std::vector<std::int64_t> train_shard_sizes() const override { return train_set_->shard_sizes(); }

  data::Batch assemble(const data::PlannedBatch& plan, bool pin_memory) const override {
    if (options_.upscale == Upscale::kDevice) return train_set_->assemble(plan, pin_memory);
    data::Batch batch = train_set_->assemble(plan, /*pin_memory=*/false);
    batch.tensors[0] = upscale(batch.tensors[0]);  // the loader pins the result
    return batch;
  }

  torch::nn::Module& model() override { return model_->module(); }
  models::ShardableModel* shardable_model() override { return model_.get(); }
  std::vector<torch::Tensor> trainable_parameters() override { return model_->module().parameters(); }
  std::vector<std::pair<std::string, torch::Tensor>> checkpoint_tensors() override {
    std::vector<std::pair<std::string, torch::Tensor>> all;
    for (const auto& p : model_->module().named_parameters()) all.emplace_back(p.key(), p.value());
    for (const auto& b : model_->module().named_buffers()) all.emplace_back(b.key(), b.value());
    return all;
  }
  std::vector<torch::Tensor> shared_buffers() override {
    if (options_.freeze_batchnorm) return {};  // never updated: identical on every rank from the seed
    return model_->module().buffers();
  }

  LossNormalization loss_normalization() const override { return LossNormalization::kMeanPerMicroBatch; }

  data::Batch prepare_on_device(data::Batch batch) override {
    if (options_.decode != Decode::kDevice) return batch;
    // The files' bytes: decoded, cropped and normalised on the current stream (the feeder's copy stream).
    batch.tensors.insert(batch.tensors.begin(), train_set_->decode_on_device(batch, device_, dtype_));
    batch.host_tensors.clear();
    return batch;
  }

  data::Batch transform(data::Batch batch) override {
    if (options_.decode == Decode::kDevice) return batch;  // prepare_on_device made the input, channels-last
    torch::Tensor x = options_.upscale == Upscale::kHost ? batch.tensors[0] : upscale(batch.tensors[0]);
    batch.tensors[0] = options_.channels_last ? x.contiguous(torch::MemoryFormat::ChannelsLast) : x;
    return batch;
  }

  MicroBatchLoss forward(const data::Batch& batch) override {
    const torch::Tensor logits = dp_ ? dp_->forward(batch.tensors[0]) : model_->forward(batch.tensors[0]);
    return {torch::nn::functional::cross_entropy(logits, batch.tensors[1]), {}};
  }
  /// Images and labels of a fixed shape per batch size (the epoch's remainder batch is a second
  /// shape); the loss a mean (normaliser 1); --strategy dp is refused by the loop.
  std::string graph_blocker(const TrainOptions&) const override { return ""; }

  std::int64_t eval_size() const override { return test_set_->size(); }
  data::Batch assemble_eval(const std::vector<std::int64_t>& indices) const override {
    data::Batch batch = test_set_->assemble({0, indices, true, 0}, /*pin_memory=*/false);
    if (options_.upscale == Upscale::kHost) batch.tensors[0] = upscale(batch.tensors[0]);
    return batch;
  }
  std::int64_t eval_terms() const override { return 2; }
  torch::Tensor eval_sums(const data::Batch& batch) override {
    const torch::Tensor predicted = model_->forward(batch.tensors[0]).argmax(1);
    const torch::Tensor correct = predicted.eq(batch.tensors[1]).sum().to(torch::kFloat64);
    return torch::stack({correct, torch::full({}, static_cast<double>(batch.samples), correct.options())});
  }
  EvalResult eval_result(const torch::Tensor& sums) const override {
    EvalResult r;
    r.correct = static_cast<std::int64_t>(sums[0].item<double>());
    r.samples = static_cast<std::int64_t>(sums[1].item<double>());
    r.accuracy = static_cast<double>(r.correct) / static_cast<double>(std::max<std::int64_t>(r.samples, 1));
    return r;
  }

  // Both image models (MobileNetV2, ResNet-50) have BatchNorm layers. Training, they normalise by
  // the batch's statistics, which PyTorch refuses to take from one value per channel: one image at a
  // last feature map of 1 x 1, i.e. an image of at most the model's output stride (32 px). Frozen,
  // they use running statistics and take any batch.
  BatchFloor min_batch_per_rank() const override {
    const std::int64_t stride = options::row_of(models::image_models(), options_.model).output_stride;
    const std::int64_t last_map = (options_.image_size + stride - 1) / stride;
    if (options_.freeze_batchnorm || last_map > 1) return {};
    return {2, fmt::format("BatchNorm normalises {} px images' last 1 x 1 feature map over the batch, and PyTorch "
                           "refuses one value per channel; or --freeze-batchnorm true",
                           options_.image_size)};
  }

  h5::Attributes attributes() const override {
    std::int64_t parameters = 0;
    for (const auto& p : model_->module().parameters()) parameters += p.numel();
    return {{"model_parameters", parameters},
            {"train_samples", train_set_->size()},
            {"test_samples", test_set_->size()},
            {"num_classes", train_set_->num_classes()},
            {"train_images_file", train_set_->path()}};
  }

 private:
  // The training and test (validation) sets of --dataset; throws DataError naming the files.
  void load_datasets(std::uint64_t seed) {
    const auto& o = options_;
    if (o.dataset == DatasetKind::kMnist) {
      data::MnistSplit train = data::load_mnist(o.data_dir, data::Split::kTrain, o.limit_train);
      data::MnistSplit test = data::load_mnist(o.data_dir, data::Split::kTest, o.limit_test);
      MGBENCH_REQUIRE(train.rows == test.rows && train.cols == test.cols, DataError,
                      "the training images ({}) are {}x{} but the test images ({}) are {}x{}: one model cannot take "
                      "both",
                      train.images_path, train.rows, train.cols, test.images_path, test.rows, test.cols);
      if (o.image_size == kNativeImageSize) resolve_native_size(train.rows, train.images_path);
      train_set_ = data::make_mnist_dataset(std::move(train));
      test_set_ = data::make_mnist_dataset(std::move(test));
      return;
    }
    const std::filesystem::path root(o.data_dir);
    const auto scan = o.dataset == DatasetKind::kImageFolder ? &data::scan_image_folder : &data::scan_webdataset;
    data::EncodedImages train = scan((root / "train").string(), o.limit_train);
    data::EncodedImages val = scan((root / "val").string(), o.limit_test);
    if (o.dataset == DatasetKind::kWebDataset) {  // classes 0 .. the largest label of either split
      if (train.classes.size() < val.classes.size()) train.classes = val.classes;
      val.classes = train.classes;
    }
    MGBENCH_REQUIRE(train.classes == val.classes, DataError,
                    "{}: train/ has {} class folders and val/ {}, or their names differ: the labels would not agree",
                    o.data_dir, train.classes.size(), val.classes.size());
    for (const data::EncodedImages* split : {&train, &val}) refuse_other_formats(*split, o.skip_bad_images);
    if (o.image_size == kNativeImageSize) resolve_native_size(data::first_image_size(train), train.records[0].name);
    const auto on_device =
        o.decode == Decode::kDevice ? std::optional<data::NvjpegBackend>(o.nvjpeg_backend) : std::nullopt;
    train_set_ = data::make_encoded_dataset(std::move(train), {o.crop, o.image_size, seed}, o.loader_threads,
                                            o.skip_bad_images, on_device);
    test_set_ = data::make_encoded_dataset(std::move(val), {data::ImageTransform::Kind::kCenter, o.image_size, seed},
                                           o.loader_threads, o.skip_bad_images, on_device);
  }

  /// Files ImageFolder lists whose format mgbench does not decode (.webp, .bmp, ...): refused at
  /// set-up (not in the middle of an epoch), or with --skip-bad-images counted in a warning.
  static void refuse_other_formats(const data::EncodedImages& split, bool skip_bad_images) {
    const std::vector<std::string> others = data::not_jpeg_or_png(split);
    if (others.empty()) return;
    const std::string what = fmt::format(
        "{}: {} of its {} image files are not JPEG or PNG (the first: {}); torchvision's ImageFolder lists them "
        "as it does, mgbench decodes JPEG and PNG",
        split.root, others.size(), split.size(), others.front());
    MGBENCH_REQUIRE(skip_bad_images, DataError,
                    "{}. Convert or remove them, or give --skip-bad-images to replace each by another image of its "
                    "batch",
                    what);
    log::warn("{}: --skip-bad-images replaces each that is not a JPEG or PNG inside by another image of its batch",
              what);
  }

  /// --image-size native: the size the files have, from now on the run's image size (its attribute).
  void resolve_native_size(std::int64_t px, const std::string& from) {
    MGBENCH_REQUIRE(px >= 1 && px <= 4096, DataError, "--image-size native: {} is {} px; expected 1-4096", from, px);
    options_.image_size = px;
    log::info("--image-size native: {} px (the shorter side of {})", px, from);
  }

  /// uint8 [B, C, h, w] -> normalised [B, C, S, S] in the model's dtype (MNIST's upscaled).
  torch::Tensor upscale(const torch::Tensor& images) const {
    return data::normalize_and_resize(images, options_.image_size, dtype_, train_set_->mean(), train_set_->std());
  }

  ImageOptions options_;
  torch::ScalarType dtype_ = torch::kFloat32;
  torch::Device device_ = torch::kCPU;
  std::unique_ptr<data::ImageDataset> train_set_;
  std::unique_ptr<data::ImageDataset> test_set_;
  std::shared_ptr<models::ImageClassifier> model_;
  std::optional<DataParallel> dp_;
};

}  // namespace

std::unique_ptr<Recipe> make_classification_recipe() { return std::make_unique<ClassificationRecipe>(); }

}  // namespace mgbench::train
