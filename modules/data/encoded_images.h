#pragma once
// Datasets of encoded image files (JPEG, PNG) with class labels, decoded and transformed on the
// host by the loader: an ImageFolder tree (root/<class>/<file>, torchvision.datasets.ImageFolder's
// classes and order) or webdataset tar shards (<key>.jpg|jpeg|png + <key>.cls, as the webdataset
// package writes them). Each sample's bytes are read when its batch is assembled (nothing is
// decoded ahead); a batch is decoded on `threads` threads.
#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "data/image_transforms.h"
#include "data/loader.h"

namespace mgbench::data {

/// One sample: where its encoded bytes are, and its class.
struct ImageRecord {
  std::string path;         // the file (or the tar shard holding it)
  std::int64_t offset = 0;  // of its bytes in path
  std::int64_t size = 0;    // bytes
  std::int64_t label = 0;   // index into EncodedImages::classes
  std::string name;         // for messages: the path, or "shard.tar:key.jpg"
};

struct EncodedImages {
  std::string root;                  // the directory (or shard pattern) it was read from
  std::vector<std::string> classes;  // class names, sorted; a label indexes them
  std::vector<ImageRecord> records;  // in the dataset's order (torchvision's for a folder)
  /// webdataset: samples per shard, in shard order (the records of shard s follow those of 0..s-1);
  /// empty for a folder. The sampler distributes whole shards (data/sampler.h).
  std::vector<std::int64_t> shard_sizes;

  std::int64_t size() const { return static_cast<std::int64_t>(records.size()); }
};

/// The file extensions torchvision's ImageFolder accepts (IMG_EXTENSIONS, case-insensitive). Files
/// of the other formats among them (.bmp, .ppm, .tif, .webp, ...) are listed as torchvision lists
/// them, and refused when decoded: mgbench decodes JPEG and PNG.
bool has_image_extension(const std::string& filename);

/// The names of the records of `set` that mgbench's decoders will refuse for their format: of the
/// files whose extension is not .jpg, .jpeg or .png (case-insensitive), those whose first bytes are
/// not a JPEG or PNG signature (image_format), or that cannot be read -- the decoder goes by the
/// bytes, so a JPEG named .bmp passes. The job checks them at set-up (refused, or with
/// --skip-bad-images counted in a warning) instead of failing in the middle of an epoch. Reads 8
/// bytes of each such file; files with a JPEG or PNG extension are not opened.
std::vector<std::string> not_jpeg_or_png(const EncodedImages& set);

/// torchvision.datasets.ImageFolder(dir)'s samples: the class folders of dir sorted by name (label =
/// position), and in each, every file with an image extension found walking it (symbolic links
/// followed), directories and files in sorted order. limit > 0 keeps the first `limit` samples.
/// Throws DataError naming dir when it is not a directory, has no class folder, or a class folder
/// holds no image file (torchvision's FileNotFoundError).
EncodedImages scan_image_folder(const std::string& dir, std::int64_t limit = 0);

/// webdataset.WebDataset's samples of the tar shards `dir`/*.tar, shards in name order: members
/// grouped by key (the path up to the first '.' of the file name, webdataset's base_plus_ext),
/// each sample's image the member with extension jpg, jpeg or png and its label the integer text
/// of its .cls member; classes "0" .. max label. limit > 0 keeps the first `limit` samples (whole
/// shards, the last one cut). Throws DataError naming the shard (and key) for a directory without
/// shards, a corrupt archive, a sample without an image or a .cls, or a .cls that is no integer.
EncodedImages scan_webdataset(const std::string& dir, std::int64_t limit = 0);

/// The shorter side of the first image of `images` [px] (its header parsed): the native size of a
/// dataset whose files share one (`--image-size native`). Throws DataError naming the file when it
/// cannot be read or is no JPEG or PNG, or when `images` is empty.
std::int64_t first_image_size(const EncodedImages& images);

/// What the host does to each decoded image before it is batched.
struct ImageTransform {
  enum class Kind {
    kRandomResizedCrop,  // RandomResizedCrop(size) + RandomHorizontalFlip(0.5): training
    kCenter,             // Resize(size) of the shorter side + CenterCrop(size): evaluation, or fixed
  };
  Kind kind = Kind::kCenter;
  std::int64_t size = 224;  // px, of the square output
  std::uint64_t seed = 0;   // the random draws of sample i in epoch e use a generator seeded by (seed, e, i)
};

/// Reads, decodes (data/image_codec.h) and transforms samples `plan.indices` of images on `threads`
/// threads (>= 1) into a Batch: tensor 0 uint8 [B, 3, size, size] with channels-last strides (the
/// bytes are [B, size, size, 3]), page-locked when pin_memory; tensor 1 int64 labels [B]. Throws
/// DataError naming the file of the first sample that cannot be read or decoded -- or, with
/// skip_bad, warns naming it and fills its place (image and label) with a good sample of the batch
/// (the first good ones, in turn; the batch keeps its size), counted in Batch::skipped_images;
/// throws only when no sample of the batch is good.
Batch assemble_encoded_batch(const EncodedImages& images, const PlannedBatch& plan, const ImageTransform& transform,
                             int threads, bool pin_memory, bool skip_bad = false);

/// The host half of decoding on the device (--decode device): each sample's file bytes, read but not
/// decoded, with its crop decided on the host from its header (the same draws as
/// assemble_encoded_batch, so both paths crop alike). Returns a Batch whose tensors are {labels
/// int64 [B]} and whose host_tensors are {bytes uint8 [total], offsets int64 [B + 1] (sample k:
/// bytes[offsets[k], offsets[k + 1])), crops int64 [B, 8] (top, left, height, width, flip, image
/// height, image width, 1 for kCenter: the whole image, resized and centre-cropped)};
/// decode_and_crop_on_device (data/device_decode.h) finishes it. The files are read and their headers
/// parsed on `threads` threads (>= 1; --loader-threads). Throws DataError naming the file of the
/// first sample (in batch order) that cannot be read or whose header is corrupt.
Batch assemble_encoded_bytes(const EncodedImages& images, const PlannedBatch& plan, const ImageTransform& transform,
                             int threads = 1);

/// The generator seed of sample `index` in `epoch` (a SplitMix64 mix of the three).
std::uint64_t sample_seed(std::uint64_t seed, std::int64_t epoch, std::int64_t index);

}  // namespace mgbench::data
