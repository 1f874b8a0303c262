#include "data/encoded_images.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <span>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "data/image_codec.h"
#include "data/tar_index.h"

namespace mgbench::data {
namespace {

namespace fs = std::filesystem;

// Every image file below dir as os.walk(dir, followlinks=True) visits them sorted: torchvision's
// make_dataset sorts the walk's (root, dirs, files) tuples, i.e. directories by their path, and
// the files of each.
void walk_sorted(const fs::path& dir, std::vector<std::string>& files) {
  std::vector<fs::path> all;
  for (const auto& e : fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink)) {
    if (e.is_regular_file() && has_image_extension(e.path().filename().string())) all.push_back(e.path());
  }
  // os.walk's sort: by the parent directory's path string, then by the file name.
  std::sort(all.begin(), all.end(), [](const fs::path& a, const fs::path& b) {
    const std::string pa = a.parent_path().string(), pb = b.parent_path().string();
    return pa != pb ? pa < pb : a.filename().string() < b.filename().string();
  });
  for (const auto& p : all) files.push_back(p.string());
}

// r's size in bytes; a size far beyond any image (a mislabelled file) is refused before anything
// is allocated for it.
std::size_t record_bytes(const ImageRecord& r) {
  MGBENCH_REQUIRE(r.size <= (std::int64_t{1} << 30), DataError, "{}: {} bytes, not an image file of 1 GiB or less",
                  r.name, r.size);
  return static_cast<std::size_t>(r.size);
}

// Reads record r into bytes (record_bytes(r) of them; allocated before: nothing to close on bad_alloc).
void read_record_into(const ImageRecord& r, std::span<std::uint8_t> bytes) {
  const int fd = ::open(r.path.c_str(), O_RDONLY | O_CLOEXEC);
  MGBENCH_REQUIRE(fd >= 0, DataError, "{}: cannot open ({})", r.name, std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(r.offset + done));
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      throw DataError(fmt::format("{}: {} of its {} bytes read ({})", r.name, done, bytes.size(),
                                  n == 0 ? "the file ended early" : std::strerror(err)));
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

std::vector<std::uint8_t> read_record(const ImageRecord& r) {
  std::vector<std::uint8_t> bytes(record_bytes(r));
  read_record_into(r, bytes);
  return bytes;
}

// The random crop of sample `index` in `epoch` from an image of info's size (RandomResizedCrop's box
// in the source, and RandomHorizontalFlip's draw).
struct SampleCrop {
  CropBox box;
  bool flip = false;
};

SampleCrop draw_crop(const ImageInfo& info, std::int64_t index, std::int64_t epoch, const ImageTransform& t) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(sample_seed(t.seed, epoch, index));
  const CropBox box = random_resized_crop_box(info.height, info.width, gen);
  return {box, random_flip(gen)};
}

// Sample k of the batch: decoded, transformed, written into out (uint8 [size, size, 3]).
void load_sample(const EncodedImages& images, std::int64_t index, std::int64_t epoch, const ImageTransform& t,
                 std::uint8_t* out) {
  const ImageRecord& r = images.records[static_cast<std::size_t>(index)];
  const std::vector<std::uint8_t> bytes = read_record(r);
  const ImageInfo info = read_image_info(bytes, r.name);
  torch::Tensor hwc = torch::empty({info.height, info.width, 3}, torch::kUInt8);
  decode_rgb(bytes, info, {hwc.data_ptr<std::uint8_t>(), static_cast<std::size_t>(hwc.numel())}, r.name);
  const torch::Tensor chw = hwc.permute({2, 0, 1});
  torch::Tensor result;
  if (t.kind == ImageTransform::Kind::kRandomResizedCrop) {
    const SampleCrop crop = draw_crop(info, index, epoch, t);
    result = resized_crop(chw, crop.box, t.size, t.size, crop.flip);
  } else {
    result = resize_and_center_crop(chw, t.size);
  }
  // [3, S, S] of any strides into the [S, S, 3] slot.
  torch::from_blob(out, {t.size, t.size, 3}, torch::kUInt8).copy_(result.permute({1, 2, 0}));
}

// torchvision's IMG_EXTENSIONS in two parts: those of the formats mgbench decodes, and the rest.
constexpr const char* kDecodedExtensions[] = {".jpg", ".jpeg", ".png"};
constexpr const char* kOtherExtensions[] = {".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};

// Whether filename ends with one of extensions, case-insensitive (torchvision's has_file_allowed_extension).
bool ends_with_any(const std::string& filename, std::span<const char* const> extensions) {
  std::string lower = filename;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return std::any_of(extensions.begin(), extensions.end(), [&](const char* e) { return lower.ends_with(e); });
}

}  // namespace

bool has_image_extension(const std::string& filename) {
  return ends_with_any(filename, kDecodedExtensions) || ends_with_any(filename, kOtherExtensions);
}

std::vector<std::string> not_jpeg_or_png(const EncodedImages& set) {
  std::vector<std::string> names;
  for (const ImageRecord& r : set.records) {
    if (ends_with_any(r.name, kDecodedExtensions)) continue;
    // The decoder goes by the first bytes, not the name: a JPEG saved as .bmp decodes.
    std::array<std::uint8_t, 8> head{};
    const auto n = static_cast<std::size_t>(std::clamp<std::int64_t>(r.size, 0, head.size()));
    try {
      read_record_into(r, std::span(head).first(n));
    } catch (const DataError&) {
      names.push_back(r.name);  // unreadable: its batch would fail on it as well
      continue;
    }
    if (!image_format(std::span<const std::uint8_t>(head).first(n))) names.push_back(r.name);
  }
  return names;
}

EncodedImages scan_image_folder(const std::string& dir, std::int64_t limit) {
  MGBENCH_REQUIRE(fs::is_directory(dir), DataError, "{}: not a directory (expected an ImageFolder: {}/<class>/<image>)",
                  dir, dir);
  EncodedImages set;
  set.root = dir;
  for (const auto& e : fs::directory_iterator(dir, fs::directory_options::follow_directory_symlink)) {
    if (e.is_directory()) set.classes.push_back(e.path().filename().string());
  }
  std::sort(set.classes.begin(), set.classes.end());
  MGBENCH_REQUIRE(!set.classes.empty(), DataError, "{}: no class folders (expected {}/<class>/<image>)", dir, dir);
  for (std::size_t label = 0; label < set.classes.size(); ++label) {
    std::vector<std::string> files;
    walk_sorted(fs::path(dir) / set.classes[label], files);
    MGBENCH_REQUIRE(!files.empty(), DataError, "{}: the class folder '{}' holds no image file (.jpg, .jpeg, .png, ...)",
                    dir, set.classes[label]);
    for (auto& f : files) {
      const auto size = static_cast<std::int64_t>(fs::file_size(f));
      set.records.push_back({f, 0, size, static_cast<std::int64_t>(label), f});
    }
  }
  if (limit > 0 && limit < set.size()) set.records.resize(static_cast<std::size_t>(limit));
  return set;
}

namespace {

constexpr std::int64_t kMaxClasses = std::int64_t{1} << 20;

// A shard's samples: members grouped by key in archive order (webdataset's group_by_keys).
void add_shard_samples(const std::string& shard, EncodedImages& set, std::int64_t& max_label) {
  struct Sample {
    std::string key;
    const TarMember* image = nullptr;
    const TarMember* cls = nullptr;
  };
  const std::vector<TarMember> members = list_tar_file(shard);
  std::vector<Sample> samples;
  for (const TarMember& m : members) {
    // webdataset's base_plus_ext, ^((?:.*/|)[^.]+)[.]([^/]*)$: the file name must not start with a
    // dot and must hold one; others (".DS_Store", macOS's "._x.jpg") belong to no sample.
    const std::size_t slash = m.name.rfind('/');
    const std::size_t base = slash == std::string::npos ? 0 : slash + 1;
    const std::size_t dot = m.name.find('.', base);
    if (dot == std::string::npos || dot == base) continue;
    const std::string key = m.name.substr(0, dot);
    std::string ext = m.name.substr(dot + 1);
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
    if (samples.empty() || samples.back().key != key) samples.push_back({key});
    const bool image = ext == "jpg" || ext == "jpeg" || ext == "png";
    const TarMember*& field = image ? samples.back().image : samples.back().cls;
    if (!image && ext != "cls") continue;
    MGBENCH_REQUIRE(field == nullptr, DataError, "{}: the sample '{}' has two {} members (webdataset refuses it too)",
                    shard, key, image ? "image" : ".cls");
    field = &m;
  }
  std::int64_t count = 0;
  for (const Sample& s : samples) {
    MGBENCH_REQUIRE(s.image != nullptr && s.cls != nullptr, DataError,
                    "{}: the sample '{}' has no {} (webdataset samples need <key>.jpg|jpeg|png and <key>.cls)", shard,
                    s.key, s.image == nullptr ? "image" : ".cls member");
    const ImageRecord cls{shard, s.cls->offset, std::min<std::int64_t>(s.cls->size, 32), 0, shard + ":" + s.key};
    const std::vector<std::uint8_t> text = read_record(cls);
    std::string digits(text.begin(), text.end());  // int(): surrounding white space allowed
    const auto space = [](unsigned char c) { return std::isspace(c) != 0; };
    while (!digits.empty() && space(digits.back())) digits.pop_back();
    digits.erase(digits.begin(), std::find_if_not(digits.begin(), digits.end(), space));
    const bool number = !digits.empty() && digits.size() <= 9 &&
                        std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
    MGBENCH_REQUIRE(number, DataError, "{}:{}.cls: '{}' is not a class index (a non-negative integer)", shard, s.key,
                    digits);
    const std::int64_t label = std::stoll(digits);
    MGBENCH_REQUIRE(label < kMaxClasses, DataError,
                    "{}:{}.cls: class {}: at most {} classes (the model gets an output per class up to the largest)",
                    shard, s.key, label, kMaxClasses);
    max_label = std::max(max_label, label);
    set.records.push_back({shard, s.image->offset, s.image->size, label, shard + ":" + s.image->name});
    ++count;
  }
  if (count > 0) set.shard_sizes.push_back(count);
}

}  // namespace

EncodedImages scan_webdataset(const std::string& dir, std::int64_t limit) {
  MGBENCH_REQUIRE(fs::is_directory(dir), DataError, "{}: not a directory (expected webdataset shards {}/*.tar)", dir,
                  dir);
  std::vector<std::string> shards;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".tar") shards.push_back(e.path().string());
  }
  std::sort(shards.begin(), shards.end());
  MGBENCH_REQUIRE(!shards.empty(), DataError, "{}: no .tar shards (expected {}/<name>-000000.tar, ...)", dir, dir);
  EncodedImages set;
  set.root = dir;
  std::int64_t max_label = -1;
  for (const auto& shard : shards) {
    add_shard_samples(shard, set, max_label);
    if (limit > 0 && set.size() >= limit) break;
  }
  MGBENCH_REQUIRE(set.size() > 0, DataError, "{}: the shards hold no sample", dir);
  if (limit > 0 && set.size() > limit) {
    set.shard_sizes.back() -= set.size() - limit;
    set.records.resize(static_cast<std::size_t>(limit));
  }
  for (std::int64_t c = 0; c <= max_label; ++c) set.classes.push_back(std::to_string(c));
  return set;
}

std::int64_t first_image_size(const EncodedImages& images) {
  MGBENCH_REQUIRE(!images.records.empty(), DataError, "{}: no image to take the native size from", images.root);
  const ImageRecord& first = images.records.front();
  const ImageInfo info = read_image_info(read_record(first), first.name);
  return std::min(info.height, info.width);
}

namespace {

/// Runs sample(k) for k = 0 .. b - 1 on `threads` threads (at most b; the calling thread is one):
/// samples k = w, w + T, w + 2T, ... on thread w. Returns each sample's exception, null where it
/// succeeded.
std::vector<std::exception_ptr> for_each_sample(std::int64_t b, int threads,
                                                const std::function<void(std::int64_t)>& sample) {
  const auto workers = std::clamp<std::int64_t>(threads, 1, std::max<std::int64_t>(b, 1));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(b));
  auto work = [&](std::int64_t w) {
    for (std::int64_t k = w; k < b; k += workers) {
      try {
        sample(k);
      } catch (...) {
        errors[static_cast<std::size_t>(k)] = std::current_exception();
      }
    }
  };
  std::vector<std::jthread> pool;
  for (std::int64_t w = 1; w < workers; ++w) pool.emplace_back(work, w);
  work(0);
  pool.clear();  // joined
  return errors;
}

}  // namespace

Batch assemble_encoded_bytes(const EncodedImages& images, const PlannedBatch& plan, const ImageTransform& transform,
                             int threads) {
  const auto b = static_cast<std::int64_t>(plan.indices.size());
  const auto record = [&](std::int64_t k) -> const ImageRecord& {
    return images.records[static_cast<std::size_t>(plan.indices[static_cast<std::size_t>(k)])];
  };
  torch::Tensor labels = torch::empty({b}, torch::kInt64);
  torch::Tensor offsets = torch::empty({b + 1}, torch::kInt64);
  torch::Tensor crops = torch::empty({b, 8}, torch::kInt64);
  auto* offset = offsets.data_ptr<std::int64_t>();
  auto* crop = crops.data_ptr<std::int64_t>();
  offset[0] = 0;
  for (std::int64_t k = 0; k < b; ++k) offset[k + 1] = offset[k] + static_cast<std::int64_t>(record_bytes(record(k)));
  torch::Tensor all = torch::empty({offset[b]}, torch::kUInt8);  // the files read straight into it
  const auto errors = for_each_sample(b, threads, [&](std::int64_t k) {
    const std::int64_t index = plan.indices[static_cast<std::size_t>(k)];
    const ImageRecord& r = record(k);
    const std::span<std::uint8_t> bytes(all.data_ptr<std::uint8_t>() + offset[k],
                                        static_cast<std::size_t>(offset[k + 1] - offset[k]));
    read_record_into(r, bytes);
    const ImageInfo info = read_image_info(bytes, r.name);
    // kCenter: the whole image (the device resizes the shorter side, then crops the centre).
    SampleCrop c{{0, 0, info.height, info.width}, false};
    if (transform.kind == ImageTransform::Kind::kRandomResizedCrop) c = draw_crop(info, index, plan.epoch, transform);
    const std::int64_t row[8] = {
        c.box.top,      c.box.left,  c.box.height, c.box.width,
        c.flip ? 1 : 0, info.height, info.width,   transform.kind == ImageTransform::Kind::kCenter ? 1 : 0};
    std::copy_n(row, 8, crop + 8 * k);
    labels.data_ptr<std::int64_t>()[k] = r.label;
  });
  for (const auto& error : errors) {  // the first in sample order
    if (error) std::rethrow_exception(error);
  }
  Batch batch;
  batch.plan = plan;
  batch.samples = b;
  batch.tensors = {std::move(labels)};
  batch.host_tensors = {std::move(all), std::move(offsets), std::move(crops)};
  for (std::int64_t k = 0; k < b; ++k) batch.sample_names.push_back(record(k).name);
  return batch;
}

std::uint64_t sample_seed(std::uint64_t seed, std::int64_t epoch, std::int64_t index) {
  auto mix = [](std::uint64_t z) {  // SplitMix64's finaliser
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  return mix(mix(mix(seed) + static_cast<std::uint64_t>(epoch)) + static_cast<std::uint64_t>(index));
}

Batch assemble_encoded_batch(const EncodedImages& images, const PlannedBatch& plan, const ImageTransform& transform,
                             int threads, bool pin_memory, bool skip_bad) {
  const auto b = static_cast<std::int64_t>(plan.indices.size());
  const auto options = torch::TensorOptions().pinned_memory(pin_memory);
  torch::Tensor pixels = torch::empty({b, transform.size, transform.size, 3}, options.dtype(torch::kUInt8));
  torch::Tensor labels = torch::empty({b}, options.dtype(torch::kInt64));
  const std::int64_t slot = transform.size * transform.size * 3;
  std::uint8_t* out = pixels.data_ptr<std::uint8_t>();
  for (std::int64_t k = 0; k < b; ++k) {
    labels.data_ptr<std::int64_t>()[k] = images.records[static_cast<std::size_t>(plan.indices[k])].label;
  }
  const auto errors = for_each_sample(b, threads, [&](std::int64_t k) {
    load_sample(images, plan.indices[static_cast<std::size_t>(k)], plan.epoch, transform, out + k * slot);
  });
  Batch batch;
  batch.plan = plan;
  batch.samples = b;
  std::vector<std::int64_t> bad;
  for (std::int64_t k = 0; k < b; ++k) {
    if (!errors[static_cast<std::size_t>(k)]) continue;
    if (!skip_bad) std::rethrow_exception(errors[static_cast<std::size_t>(k)]);
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(k)]);
    } catch (const DataError& e) {
      log::warn("--skip-bad-images: {} (replaced by another image of its batch)", e.what());
    }  // anything but a DataError (out of memory, a defect) propagates
    bad.push_back(k);
  }
  if (!bad.empty()) {
    MGBENCH_REQUIRE(static_cast<std::int64_t>(bad.size()) < b, DataError,
                    "--skip-bad-images: none of the {} images of a batch could be decoded (the first: {})", b,
                    images.records[static_cast<std::size_t>(plan.indices[static_cast<std::size_t>(bad[0])])].name);
    std::vector<std::int64_t> good;
    for (std::int64_t k = 0, j = 0; k < b; ++k) {
      if (j < static_cast<std::int64_t>(bad.size()) && bad[static_cast<std::size_t>(j)] == k) {
        ++j;
      } else {
        good.push_back(k);
      }
    }
    for (std::size_t j = 0; j < bad.size(); ++j) {
      const std::int64_t from = good[j % good.size()], to = bad[j];
      std::memcpy(out + to * slot, out + from * slot, static_cast<std::size_t>(slot));
      labels.data_ptr<std::int64_t>()[to] = labels.data_ptr<std::int64_t>()[from];
    }
    batch.skipped_images = static_cast<std::int64_t>(bad.size());
  }
  batch.tensors = {pixels.permute({0, 3, 1, 2}), std::move(labels)};
  return batch;
}

}  // namespace mgbench::data
