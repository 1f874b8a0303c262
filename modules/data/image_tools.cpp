#include "data/image_tools.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "core/error.h"
#include "data/encoded_images.h"
#include "data/image_codec.h"
#include "data/image_transforms.h"
#include "data/mnist.h"
#include "data/sampler.h"

namespace mgbench::data {
namespace {

namespace fs = std::filesystem;

void write_file(const fs::path& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  MGBENCH_REQUIRE(f.good(), DataError, "{}: cannot write", path.string());
}

// Sample i of split as an encoded S x S RGB image.
std::vector<std::uint8_t> encode_sample(const MnistSplit& split, std::int64_t i, const MakeImagesOptions& o) {
  const torch::Tensor digit = torch::from_blob(const_cast<std::uint8_t*>(split.images.data()) + i * split.image_bytes(),
                                               {1, split.rows, split.cols}, torch::kUInt8)
                                  .expand({3, split.rows, split.cols});
  const torch::Tensor rgb =
      resized_crop(digit, {0, 0, split.rows, split.cols}, o.image_size, o.image_size).permute({1, 2, 0}).contiguous();
  const std::span<const std::uint8_t> pixels(rgb.data_ptr<std::uint8_t>(), static_cast<std::size_t>(rgb.numel()));
  return o.format == "png" ? encode_png(pixels, o.image_size, o.image_size)
                           : encode_jpeg(pixels, o.image_size, o.image_size, o.quality);
}

// Writes split into dir/<label>/<index>.<ext> on o.threads threads; returns the bytes written.
std::int64_t write_split(const MnistSplit& split, const fs::path& dir, const MakeImagesOptions& o) {
  // A folder per class present (torchvision's ImageFolder refuses an empty one).
  for (const std::int64_t label : std::set<std::int64_t>(split.labels.begin(), split.labels.end())) {
    fs::create_directories(dir / std::to_string(label));
  }
  const std::string ext = o.format == "png" ? "png" : "jpg";
  std::atomic<std::int64_t> next{0}, bytes{0};
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(o.threads));
  auto work = [&](int w) {
    try {
      for (std::int64_t i = next++; i < split.size(); i = next++) {
        const auto encoded = encode_sample(split, i, o);
        write_file(dir / std::to_string(split.labels[static_cast<std::size_t>(i)]) / fmt::format("{:06d}.{}", i, ext),
                   encoded);
        bytes += static_cast<std::int64_t>(encoded.size());
      }
    } catch (...) {
      errors[static_cast<std::size_t>(w)] = std::current_exception();
      next = split.size();
    }
  };
  {
    std::vector<std::jthread> pool;
    for (int w = 1; w < o.threads; ++w) pool.emplace_back(work, w);
    work(0);
  }
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return bytes;
}

}  // namespace

void MakeImagesOptions::declare(options::OptionTable& t) {
  t.add("action", action, "what to do: make-images")
      .positional(1)
      .required()
      .value_name("ACTION")
      .check([](const std::string& a) { return a == "make-images"; }, "make-images");
  t.add("data", data, "directory with MNIST-format IDX files (MNIST, Fashion-MNIST)").required().value_name("DIR");
  t.add("out", out, "the ImageFolder to write: OUT/train/<class>/, OUT/val/<class>/").required().value_name("DIR");
  t.add("image-size", image_size, "side of the square images [px]").at_least(1).at_most(4096);
  t.add("format", format, "jpeg or png")
      .check([](const std::string& f) { return f == "jpeg" || f == "png"; }, "jpeg, png");
  t.add("quality", quality, "JPEG quality (libjpeg's scale; 4:2:0 chroma subsampling)")
      .at_least(1)
      .at_most(100)
      .only_with([this] { return format == "jpeg"; }, "--format jpeg");
  t.add("limit-train", limit_train, "write the first N training images (0: all)").at_least(0);
  t.add("limit-test", limit_test, "write the first N test images (0: all)").at_least(0);
  t.add("threads", threads, "encoding threads").at_least(1).at_most(256);
}

int make_images(const MakeImagesOptions& o, std::ostream& out, std::ostream& err) {
  try {
    torch::set_num_threads(1);  // parallel over files, not inside each resize
    // Files of an earlier make-images (more of them, or of another format) would stay in the
    // dataset beside the new ones: an ImageFolder is every image below its split.
    for (const char* name : {"train", "val"}) {
      const fs::path split = fs::path(o.out) / name;
      std::error_code ec;
      MGBENCH_REQUIRE(!fs::exists(split, ec) || fs::is_empty(split, ec), ConfigError,
                      "--out '{}': {} already holds files (an earlier dataset's?), which would stay in the new one: "
                      "give a new or empty --out directory",
                      o.out, split.string());
    }
    // Both splits read before either is written: a missing or corrupt test split left the training
    // split written, and the rerun was then refused for the files it left.
    const MnistSplit train = load_mnist(o.data, Split::kTrain, o.limit_train);
    const MnistSplit test = load_mnist(o.data, Split::kTest, o.limit_test);
    for (const auto& [split, name] : {std::pair{&train, "train"}, std::pair{&test, "val"}}) {
      const MnistSplit& images = *split;
      const auto start = std::chrono::steady_clock::now();
      const std::int64_t bytes = write_split(images, fs::path(o.out) / name, o);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      out << fmt::format("{}/{}: {} {} files of {} x {} px, {:.1f} MiB, {:.1f} s\n", o.out, name, images.size(),
                         o.format, o.image_size, o.image_size, static_cast<double>(bytes) / (1 << 20), seconds);
    }
    return 0;
  } catch (const ConfigError& e) {
    err << "mgbench data make-images: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "mgbench data make-images: " << error_message(e) << "\n";
    return 1;
  }
}

void ReadImagesOptions::declare(options::OptionTable& t) {
  t.add("action", action, "what to do: read-images")
      .positional(1)
      .required()
      .value_name("ACTION")
      .check([](const std::string& a) { return a == "read-images"; }, "read-images");
  t.add("dataset", dataset, "imagefolder or webdataset")
      .check([](const std::string& d) { return d == "imagefolder" || d == "webdataset"; }, "imagefolder, webdataset");
  t.add("data", data, "the dataset root: its train/ split is read").required().value_name("DIR");
  t.add("image-size", image_size, "side of the square crops [px]").at_least(1).at_most(4096);
  t.add("crop", crop, "random (RandomResizedCrop + flip) or center (Resize + CenterCrop)")
      .check([](const std::string& c) { return c == "random" || c == "center"; }, "random, center");
  t.add("batch-size", batch_size, "images per batch").at_least(1);
  t.add("batches", batches, "batches timed (after one untimed)").at_least(1);
  t.add("loader-threads", loader_threads, "threads decoding and cropping a batch").at_least(1).at_most(256);
  t.add("seed", seed, "the shuffle's and the crops' seed");
}

int read_images(const ReadImagesOptions& o, std::ostream& out, std::ostream& err) {
  try {
    torch::set_num_threads(1);  // as in a rank: the loader's threads, not torch's, are the parallelism
    const std::string root = (fs::path(o.data) / "train").string();
    const EncodedImages images = o.dataset == "webdataset" ? scan_webdataset(root) : scan_image_folder(root);
    EpochPlanOptions plan_options{axes::Strategy::kDdpDs, images.size(), o.batch_size, 1, 0, o.seed, true, false,
                                  images.shard_sizes};
    const ImageTransform transform{
        o.crop == "center" ? ImageTransform::Kind::kCenter : ImageTransform::Kind::kRandomResizedCrop, o.image_size,
        o.seed};
    std::int64_t done = 0, timed_images = 0, epoch = 0;
    std::chrono::steady_clock::time_point start;
    while (done <= o.batches) {
      for (const auto& batch : plan_epoch(plan_options, epoch++)) {
        if (done > o.batches) break;
        if (done == 1) start = std::chrono::steady_clock::now();  // the first batch warms up
        const Batch b = assemble_encoded_batch(images, batch, transform, o.loader_threads, false);
        if (done >= 1) timed_images += b.samples;
        ++done;
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    out << fmt::format(R"({{"img_per_s": {:.2f}, "images": {}, "seconds": {:.4f}, "threads": {}, "image_size": {}}})",
                       static_cast<double>(timed_images) / seconds, timed_images, seconds, o.loader_threads,
                       o.image_size)
        << "\n";
    return 0;
  } catch (const std::exception& e) {
    err << "mgbench data read-images: " << error_message(e) << "\n";
    return 1;
  }
}

}  // namespace mgbench::data
