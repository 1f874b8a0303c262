#pragma once
// The image tools of the command line. `mgbench data make-images`: an MNIST-format dataset written as
// image files at a given size -- the
// encoded-image datasets' input (--dataset imagefolder) where no real dataset is at hand. Each 28 x 28
// digit is upscaled (antialiased bilinear, as torchvision's Resize) to S x S, replicated into RGB and
// encoded as JPEG (TurboJPEG, 4:2:0, the given quality) or PNG: OUT/train/<digit>/<index>.jpg and
// OUT/val/<digit>/<index>.jpg (the MNIST test split), index zero-padded to 6 digits so that file
// order is sample order.
#include <cstdint>
#include <ostream>
#include <string>

#include "core/option_table.h"

namespace mgbench::data {

struct MakeImagesOptions {
  /// --help's text above the options.
  static constexpr const char* kUsage =
      "mgbench data make-images: MNIST-format IDX files -> an ImageFolder of JPEG or PNG files at a given size\n"
      "usage: mgbench data make-images --data MNIST_DIR --out DIR --image-size S [--format jpeg|png] [--quality Q]";

  std::string action;  // "make-images" (the operand)
  std::string data;    // MNIST-format directory
  std::string out;     // the ImageFolder root to write (train/, val/)
  std::int64_t image_size = 224;
  std::string format = "jpeg";
  int quality = 90;
  std::int64_t limit_train = 0;  // 0: all
  std::int64_t limit_test = 0;
  int threads = 4;

  void declare(options::OptionTable& table);
};

/// Writes the dataset and prints a line per split (files, bytes, seconds) on out. Returns the exit
/// code: 0, or 1 with the message on err (unreadable MNIST files, an unwritable OUT).
int make_images(const MakeImagesOptions& options, std::ostream& out, std::ostream& err);

/// `mgbench data read-images`: the host loader alone -- read, decode, crop and batch the training
/// images of an imagefolder or webdataset tree as `mgbench image` does, on --loader-threads threads,
/// without training -- to measure what one rank's data phase can deliver (bench/compare_loader.sh
/// sets torchvision's DataLoader beside it).
struct ReadImagesOptions {
  static constexpr const char* kUsage =
      "mgbench data read-images: decode and crop a dataset's training images as `mgbench image` does; img/s\n"
      "usage: mgbench data read-images --dataset imagefolder|webdataset --data DIR [--image-size S] [--batches N]";

  std::string action;  // "read-images" (the operand)
  std::string dataset = "imagefolder";
  std::string data;  // the dataset root (train/, val/)
  std::int64_t image_size = 224;
  std::string crop = "random";
  std::int64_t batch_size = 64;
  std::int64_t batches = 20;  // timed, after one untimed
  int loader_threads = 4;
  std::uint64_t seed = 42;

  void declare(options::OptionTable& table);
};

/// Prints one JSON line on out: {"img_per_s", "images", "seconds", "threads", "image_size"}. Returns
/// the exit code: 0, or 1 with the message on err (unreadable or undecodable files).
int read_images(const ReadImagesOptions& options, std::ostream& out, std::ostream& err);

}  // namespace mgbench::data
