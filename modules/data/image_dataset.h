#pragma once
// The image classification recipe's datasets behind one interface (--dataset): MNIST-format IDX
// files held in memory, and encoded-image files (an ImageFolder tree, webdataset shards) decoded by
// the loader. Each
// assembles a rank's host batch -- uint8 images [B, C, h, w] and int64 labels [B] -- and states how
// its pixels are normalised.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "data/device_decode.h"
#include "data/encoded_images.h"
#include "data/loader.h"
#include "data/mnist.h"

namespace mgbench::data {

class ImageDataset {
 public:
  virtual ~ImageDataset() = default;
  virtual std::int64_t size() const = 0;
  virtual std::int64_t num_classes() const = 0;
  /// Side of the images a batch holds [px]: MNIST's 28 (upscaled later), else the transform's size.
  virtual std::int64_t image_size() const = 0;
  /// The host batch of plan's samples: uint8 [B, C, h, w] (C = 1 or 3) and int64 labels [B].
  /// Throws DataError naming the file of a sample that cannot be read or decoded.
  virtual Batch assemble(const PlannedBatch& plan, bool pin_memory) const = 0;
  /// Per-channel mean and standard deviation of the pixels in [0, 1] (one value: every channel).
  virtual std::span<const double> mean() const = 0;
  virtual std::span<const double> std() const = 0;
  /// Where it was read from (a file or directory), for the run's attributes.
  virtual std::string path() const = 0;
  /// Samples per tar shard (webdataset); empty otherwise.
  virtual std::vector<std::int64_t> shard_sizes() const { return {}; }
  /// Decoding on the device (--decode device): assemble() gives the files' bytes and crops
  /// (tensors {labels}), and this turns such a batch into normalised images [B, 3, S, S] of dtype on
  /// device (data/device_decode.h). Undefined for a dataset decoded on the host.
  virtual torch::Tensor decode_on_device(const Batch& batch, const torch::Device& device,
                                         torch::ScalarType dtype) const {
    return {};
  }
};

/// An MNIST-format split (data/mnist.h): 28 x 28 greyscale, normalised with MNIST's statistics.
std::unique_ptr<ImageDataset> make_mnist_dataset(MnistSplit split);

/// Encoded images (data/encoded_images.h) decoded on `threads` loader threads and transformed by
/// transform, normalised with ImageNet's statistics; skip_bad: undecodable files replaced and counted
/// (assemble_encoded_batch); device_decode: the loader only reads the files and draws the crops, the
/// device decodes with this nvJPEG back-end (decode_on_device).
std::unique_ptr<ImageDataset> make_encoded_dataset(EncodedImages images, ImageTransform transform, int threads,
                                                   bool skip_bad,
                                                   std::optional<NvjpegBackend> device_decode = std::nullopt);

}  // namespace mgbench::data
