// Host image decoding (data/image_codec.h) against PIL, and the image transforms
// (data/image_transforms.h) against torchvision: the files and references of
// tests/python/image_oracles.py (real photos from scikit-image's data, generated JPEGs and PNGs of
// every kind the loader meets, and files it must refuse).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/device_decode.h"
#include "data/encoded_images.h"
#include "data/image_codec.h"
#include "data/image_transforms.h"
#include "data/tar_index.h"
#include "data/transforms.h"
#include "test_support.h"

namespace mgbench {
namespace {

std::string images_dir() { return test::oracle_dir() + "/images"; }

std::vector<std::uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The file decoded: uint8 [3, H, W] viewing the HWC pixels (channels-last strides).
torch::Tensor decode_file(const std::string& name) {
  const auto bytes = read_bytes(images_dir() + "/" + name);
  const data::ImageInfo info = data::read_image_info(bytes, name);
  torch::Tensor hwc = torch::empty({info.height, info.width, 3}, torch::kUInt8);
  data::decode_rgb(bytes, info, {hwc.data_ptr<std::uint8_t>(), static_cast<std::size_t>(hwc.numel())}, name);
  return hwc.permute({2, 0, 1});
}

TEST(ImageCodec, DecodesAsPilConvertsToRgb) {
  const auto manifest = test::load_oracle_json("images/manifest.json");
  MGBENCH_SKIP_WITHOUT_ORACLE(manifest, "images/manifest.json");
  int images = 0, photos = 0;
  for (const auto& entry : manifest) {
    if (entry.contains("error")) continue;
    const std::string name = entry["file"];
    SCOPED_TRACE(name);
    const auto bytes = read_bytes(images_dir() + "/" + name);
    const data::ImageInfo info = data::read_image_info(bytes, name);
    EXPECT_EQ(info.width, entry["width"].get<std::int64_t>());
    EXPECT_EQ(info.height, entry["height"].get<std::int64_t>());
    std::vector<std::uint8_t> rgb(static_cast<std::size_t>(info.rgb_bytes()));
    data::decode_rgb(bytes, info, rgb, name);
    const auto expected = read_bytes(images_dir() + "/" + entry["rgb"].get<std::string>());
    ASSERT_EQ(rgb.size(), expected.size());
    std::size_t differing = 0;
    for (std::size_t i = 0; i < rgb.size(); ++i) differing += rgb[i] != expected[i];
    EXPECT_EQ(differing, 0u) << "bytes differing from PIL's";
    ++images;
    photos += name.starts_with("photo_");
  }
  EXPECT_GE(images, 11);
  if (photos == 0) {
    MGBENCH_SKIP_MISSING("generated files only: scikit-image's photos are not installed (install-deps.sh)");
  }
}

TEST(ImageCodec, RefusesBadFilesNamingThem) {
  const auto manifest = test::load_oracle_json("images/manifest.json");
  MGBENCH_SKIP_WITHOUT_ORACLE(manifest, "images/manifest.json");
  int refused = 0;
  for (const auto& entry : manifest) {
    if (!entry.contains("error")) continue;
    const std::string name = entry["file"];
    SCOPED_TRACE(name);
    const auto bytes = read_bytes(images_dir() + "/" + name);
    test::expect_error<DataError>(
        [&] {
          const data::ImageInfo info = data::read_image_info(bytes, name);
          std::vector<std::uint8_t> rgb(static_cast<std::size_t>(info.rgb_bytes()));
          data::decode_rgb(bytes, info, rgb, name);
        },
        {name, entry["error"].get<std::string>()});
    ++refused;
  }
  EXPECT_GE(refused, 6);
}

TEST(ImageCodec, EncodedFilesDecodeBack) {
  torch::manual_seed(3);
  const torch::Tensor rgb = torch::randint(0, 256, {21, 34, 3}, torch::kUInt8);
  const std::span<const std::uint8_t> pixels(rgb.data_ptr<std::uint8_t>(), static_cast<std::size_t>(rgb.numel()));
  const auto png = data::encode_png(pixels, 34, 21);
  const data::ImageInfo info = data::read_image_info(png, "x.png");
  EXPECT_EQ(info.format, data::ImageFormat::kPng);
  std::vector<std::uint8_t> back(static_cast<std::size_t>(info.rgb_bytes()));
  data::decode_rgb(png, info, back, "x.png");
  EXPECT_TRUE(std::equal(back.begin(), back.end(), pixels.begin()));  // lossless
  const auto jpeg = data::encode_jpeg(pixels, 34, 21, 90);
  EXPECT_EQ(data::read_image_info(jpeg, "x.jpg").format, data::ImageFormat::kJpeg);
  EXPECT_THROW(data::encode_jpeg(pixels, 34, 21, 0), std::invalid_argument);
  EXPECT_THROW(data::encode_png(pixels, 33, 21), std::invalid_argument);
}

TEST(ImageFolder, ClassesAndSamplesInTorchvisionsOrder) {
  const auto oracle = test::load_oracle_json("images/folder.json");
  MGBENCH_SKIP_WITHOUT_ORACLE(oracle, "images/folder.json");
  const std::string root = images_dir() + "/folder";
  const data::EncodedImages set = data::scan_image_folder(root);
  EXPECT_EQ(set.classes, oracle["classes"].get<std::vector<std::string>>());
  ASSERT_EQ(set.size(), static_cast<std::int64_t>(oracle["samples"].size()));
  for (std::size_t i = 0; i < set.records.size(); ++i) {
    // Below root as found (a linked folder's files under the link's name, as os.walk gives them).
    EXPECT_EQ(set.records[i].path, root + "/" + oracle["samples"][i][0].get<std::string>()) << i;
    EXPECT_EQ(set.records[i].label, oracle["samples"][i][1].get<std::int64_t>()) << i;
    EXPECT_EQ(set.records[i].size, static_cast<std::int64_t>(std::filesystem::file_size(set.records[i].path)));
  }
  EXPECT_EQ(data::scan_image_folder(root, 3).size(), 3);
  test::expect_error<DataError>([&] { data::scan_image_folder(root + "/cat/b.png"); },
                                {"cat/b.png", "not a directory"});
  test::expect_error<DataError>([&] { data::scan_image_folder(root + "/cat/sub"); }, {"no class folders"});
}

// A batch of files: decoded, cropped by each sample's own draws (the same for the same epoch and
// index, whatever the thread count), labelled; a file that cannot be decoded named.
TEST(ImageFolder, BatchesDecodeAndCropReproduciblyOnAnyThreadCount) {
  const auto oracle = test::load_oracle_json("images/folder.json");
  MGBENCH_SKIP_WITHOUT_ORACLE(oracle, "images/folder.json");
  const data::EncodedImages set = data::scan_image_folder(images_dir() + "/folder");
  const data::ImageTransform random{data::ImageTransform::Kind::kRandomResizedCrop, 3, 42};
  const data::PlannedBatch plan{0, {4, 0, 2, 3}, true, 5};
  const data::Batch one = data::assemble_encoded_batch(set, plan, random, 1, false);
  const data::Batch three = data::assemble_encoded_batch(set, plan, random, 3, false);
  ASSERT_EQ(one.tensors[0].sizes(), (std::vector<std::int64_t>{4, 3, 3, 3}));
  EXPECT_TRUE(one.tensors[0].is_contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(torch::equal(one.tensors[0], three.tensors[0]));
  EXPECT_TRUE(torch::equal(one.tensors[1], torch::tensor({1, 0, 1, 1}, torch::kInt64)));
  // Every file is the same solid colour: any crop of it is that colour.
  EXPECT_TRUE(torch::equal(one.tensors[0][0][0], torch::full({3, 3}, 200, torch::kUInt8)));
  // 1.webp is not a JPEG or PNG: named; with skip_bad, replaced by the batch's good sample and counted.
  test::expect_error<DataError>(
      [&] {
        data::assemble_encoded_batch(set, {0, {5, 6}, true, 0}, random, 2, false);
      },
      {"1.webp", "neither"});
  const data::Batch skipped = data::assemble_encoded_batch(set, {0, {6, 5, 1}, true, 0}, random, 2, false, true);
  EXPECT_EQ(skipped.skipped_images, 1);
  EXPECT_EQ(skipped.samples, 3);
  EXPECT_TRUE(torch::equal(skipped.tensors[0][0], skipped.tensors[0][1]));
  EXPECT_TRUE(torch::equal(skipped.tensors[1], torch::tensor({2, 2, 1}, torch::kInt64)));
  test::expect_error<DataError>(
      [&] {
        data::assemble_encoded_batch(set, {0, {6}, true, 0}, random, 1, false, true);
      },
      {"none of the 1", "1.webp"});
}

// --decode device's host half: the files' bytes as they are, and the crops the host path draws.
TEST(ImageFolder, BytesForTheDeviceCarryTheHostPathsCrops) {
  const auto oracle = test::load_oracle_json("images/folder.json");
  MGBENCH_SKIP_WITHOUT_ORACLE(oracle, "images/folder.json");
  const data::EncodedImages set = data::scan_image_folder(images_dir() + "/folder");
  const data::ImageTransform random{data::ImageTransform::Kind::kRandomResizedCrop, 3, 42};
  const data::PlannedBatch plan{0, {4, 0, 2}, true, 5};
  for (const int threads : {3, 1}) {  // read on loader threads, or on one: the same batch
    SCOPED_TRACE(testing::Message() << threads << " thread(s)");
    const data::Batch bytes = data::assemble_encoded_bytes(set, plan, random, threads);
    ASSERT_EQ(bytes.host_tensors.size(), 3u);
    EXPECT_TRUE(torch::equal(bytes.tensors[0], torch::tensor({1, 0, 1}, torch::kInt64)));
    const auto* offsets = bytes.host_tensors[1].data_ptr<std::int64_t>();
    const auto* crops = bytes.host_tensors[2].data_ptr<std::int64_t>();
    for (std::int64_t k = 0; k < 3; ++k) {
      const auto& record = set.records[static_cast<std::size_t>(plan.indices[static_cast<std::size_t>(k)])];
      const auto file = read_bytes(record.path);
      ASSERT_EQ(offsets[k + 1] - offsets[k], static_cast<std::int64_t>(file.size()));
      EXPECT_TRUE(std::equal(file.begin(), file.end(), bytes.host_tensors[0].data_ptr<std::uint8_t>() + offsets[k]));
      // The draws of sample `index` in epoch 5, as assemble_encoded_batch makes them.
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(data::sample_seed(42, 5, plan.indices[k]));
      const data::CropBox box = data::random_resized_crop_box(4, 4, gen);
      const std::vector<std::int64_t> row(crops + 8 * k, crops + 8 * k + 8);
      EXPECT_EQ(row,
                (std::vector<std::int64_t>{box.top, box.left, box.height, box.width, data::random_flip(gen), 4, 4, 0}));
    }
    // Without a GPU (or nvJPEG): a ConfigError saying so, never a crash.
    test::expect_error<ConfigError>(
        [&] {
          data::decode_and_crop_on_device(bytes, data::NvjpegBackend::kAuto, 3, torch::kCPU, torch::kFloat32,
                                          data::kImageNetMean, data::kImageNetStd);
        },
        {"--decode device"});
  }
  // A file that is no JPEG or PNG is named, whichever thread read it.
  test::expect_error<DataError>(
      [&] {
        data::assemble_encoded_bytes(set, {0, {4, 6, 0}, true, 0}, random, 3);
      },
      {"1.webp"});
}

// webdataset's key rule (base_plus_ext): "._k0.jpg" and ".DS_Store" belong to no sample, a dotted
// folder keeps its name; a .cls as int() reads it; shards to refuse are named.
TEST(WebDataset, SamplesAsWebdatasetGroupsThem) {
  const auto oracle = test::load_oracle_json("images/manifest.json");
  MGBENCH_SKIP_WITHOUT_ORACLE(oracle, "images/manifest.json");
  const std::string wds = images_dir() + "/wds";
  const data::EncodedImages set = data::scan_webdataset(wds + "/good/train");
  ASSERT_EQ(set.size(), 2);
  EXPECT_EQ(set.shard_sizes, (std::vector<std::int64_t>{2}));
  EXPECT_TRUE(set.records[0].name.ends_with(":k0.jpg")) << set.records[0].name;
  EXPECT_EQ(set.records[0].label, 3);
  EXPECT_TRUE(set.records[1].name.ends_with(":dir.x/k1.png")) << set.records[1].name;
  EXPECT_EQ(set.records[1].label, 1);
  EXPECT_EQ(set.classes, (std::vector<std::string>{"0", "1", "2", "3"}));
  test::expect_error<DataError>([&] { data::scan_webdataset(wds + "/huge_class/train"); },
                                {"k.cls", "999999999", "at most"});
  test::expect_error<DataError>([&] { data::scan_webdataset(wds + "/no_cls/train"); }, {"a-000000.tar", "'k'", ".cls"});
  test::expect_error<DataError>([&] { data::scan_webdataset(wds + "/two_images/train"); }, {"'k'", "two image"});
}

// A GNU base-256 size near INT64_MAX: refused as running past the end, no overflow (fuzz-found shape).
TEST(TarIndex, AHugeBase256SizeIsRefused) {
  std::vector<std::uint8_t> archive(3 * 512, 0);
  std::memcpy(archive.data(), "k.jpg", 5);
  const std::uint8_t size[12] = {0x80, 0, 0, 0, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  std::memcpy(archive.data() + 124, size, 12);
  archive[156] = '0';
  std::memset(archive.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; ++i) sum += archive[static_cast<std::size_t>(i)];
  std::snprintf(reinterpret_cast<char*>(archive.data()) + 148, 8, "%06o", sum);
  const auto read = [&](std::int64_t offset, std::span<std::uint8_t> out) {
    const auto n = std::min<std::size_t>(out.size(), archive.size() - static_cast<std::size_t>(offset));
    std::copy_n(archive.begin() + offset, n, out.begin());
    return n;
  };
  test::expect_error<DataError>(
      [&] { data::list_tar_members(read, static_cast<std::int64_t>(archive.size()), "huge.tar"); },
      {"huge.tar", "'k.jpg'", "truncated"});
}

TEST(TarIndex, MembersAsPythonsTarfileListsThem) {
  const auto oracle = test::load_oracle_json("images/tar_members.json");
  MGBENCH_SKIP_WITHOUT_ORACLE(oracle, "images/tar_members.json");
  for (const auto& archive : oracle) {
    const std::string path = images_dir() + "/" + archive["file"].get<std::string>();
    SCOPED_TRACE(path);
    const auto members = data::list_tar_file(path);
    ASSERT_EQ(members.size(), archive["members"].size());
    for (std::size_t i = 0; i < members.size(); ++i) {
      EXPECT_EQ(members[i].name, archive["members"][i][0].get<std::string>());
      EXPECT_EQ(members[i].offset, archive["members"][i][1].get<std::int64_t>());
      EXPECT_EQ(members[i].size, archive["members"][i][2].get<std::int64_t>());
    }
    // Cut short or corrupted: named, never read past the end.
    const auto bytes = read_bytes(path);
    const auto read_from = [](const std::vector<std::uint8_t>& b) {
      return [&b](std::int64_t offset, std::span<std::uint8_t> out) {
        const auto n = std::min<std::size_t>(out.size(), b.size() - static_cast<std::size_t>(offset));
        std::copy_n(b.begin() + offset, n, out.begin());
        return n;
      };
    };
    const std::vector<std::uint8_t> cut(bytes.begin(),
                                        bytes.begin() + archive["members"][1][1].get<std::int64_t>() + 1);
    test::expect_error<DataError>(
        [&] { data::list_tar_members(read_from(cut), static_cast<std::int64_t>(cut.size()), "cut.tar"); },
        {"cut.tar", "truncated"});
    // Cut where tarfile and webdataset read on silently: at the boundary after the first member (its
    // padded data's end), inside the next header, and before the end-of-archive blocks.
    const auto member_end = [&](std::size_t i) {
      const std::int64_t end =
          archive["members"][i][1].get<std::int64_t>() + archive["members"][i][2].get<std::int64_t>();
      return static_cast<std::size_t>((end + 511) / 512 * 512);
    };
    const std::size_t last = archive["members"].size() - 1;
    for (const auto& [at, what] : std::vector<std::pair<std::size_t, std::string>>{
             {member_end(0), "no end-of-archive block at byte " + std::to_string(member_end(0))},
             {member_end(0) + 100, "a header cut off at byte " + std::to_string(member_end(0))},
             {member_end(last), "no end-of-archive block"}}) {
      const std::vector<std::uint8_t> short_by(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(at));
      test::expect_error<DataError>(
          [&] { data::list_tar_members(read_from(short_by), static_cast<std::int64_t>(at), "short.tar"); },
          {"short.tar: truncated", what});
    }
    std::vector<std::uint8_t> flipped = bytes;
    flipped[3] ^= 0x20;
    test::expect_error<DataError>(
        [&] { data::list_tar_members(read_from(flipped), static_cast<std::int64_t>(flipped.size()), "f.tar"); },
        {"f.tar", "checksum", "byte 0"});
  }
}

TEST(ImageTransforms, RandomResizedCropAndFlipDrawAsTorchvision) {
  const auto oracle = test::load_oracle_json("images/transforms.json");
  MGBENCH_SKIP_WITHOUT_ORACLE(oracle, "images/transforms.json");
  for (const auto& c : oracle["crops"]) {
    SCOPED_TRACE(c.dump());
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(c["seed"].get<std::uint64_t>());
    const data::CropBox box = data::random_resized_crop_box(c["height"], c["width"], gen);
    EXPECT_EQ(box.top, c["top"].get<std::int64_t>());
    EXPECT_EQ(box.left, c["left"].get<std::int64_t>());
    EXPECT_EQ(box.height, c["crop_height"].get<std::int64_t>());
    EXPECT_EQ(box.width, c["crop_width"].get<std::int64_t>());
    EXPECT_EQ(data::random_flip(gen), c["flip"].get<bool>());
  }
}

TEST(ImageTransforms, ResizeAndCenterCropEqualTorchvisionBitwise) {
  const auto oracle = test::load_oracle_json("images/transforms.json");
  MGBENCH_SKIP_WITHOUT_ORACLE(oracle, "images/transforms.json");
  const torch::Tensor source = decode_file(oracle["source"]);  // [3, 77, 131], channels-last strides
  auto expect_equal = [](const torch::Tensor& ours, const std::string& file) {
    const auto bytes = read_bytes(images_dir() + "/" + file);
    const torch::Tensor expected =
        torch::from_blob(const_cast<std::uint8_t*>(bytes.data()), ours.sizes(), torch::kUInt8).clone();
    EXPECT_EQ((ours.to(torch::kInt32) - expected.to(torch::kInt32)).abs().max().item<int>(), 0) << file;
  };
  for (const auto& r : oracle["resizes"]) {
    const torch::Tensor ours =
        data::resized_crop(source, {0, 0, source.size(1), source.size(2)}, r["height"], r["width"]);
    expect_equal(ours.contiguous(), r["file"]);
    // The same from a contiguous CHW source: the layout does not change the values.
    expect_equal(data::resized_crop(source.contiguous(), {0, 0, 77, 131}, r["height"], r["width"]).contiguous(),
                 r["file"]);
    // Floating point (--decode device's dtype) stays so, unrounded, within a level of torchvision's uint8.
    const torch::Tensor floating =
        data::resized_crop(source.to(torch::kFloat32), {0, 0, 77, 131}, r["height"], r["width"]);
    EXPECT_EQ(floating.scalar_type(), torch::kFloat32);
    EXPECT_LE((floating - ours.to(torch::kFloat32)).abs().max().item<double>(), 1.0) << r["file"];
  }
  EXPECT_THROW(data::resized_crop(source.to(torch::kInt32), {0, 0, 77, 131}, 8, 8), std::invalid_argument);
  expect_equal(data::resize_and_center_crop(source, oracle["short_center"]["size"]).contiguous(),
               oracle["short_center"]["file"]);
}

TEST(ImageTransforms, CenterCropAndShorterSideFollowTorchvisionsRounding) {
  EXPECT_EQ(data::shorter_side_size(375, 500, 256), (std::pair<std::int64_t, std::int64_t>{256, 341}));
  EXPECT_EQ(data::shorter_side_size(500, 375, 256), (std::pair<std::int64_t, std::int64_t>{341, 256}));
  const data::CropBox box = data::center_crop_box(5, 8, 2);  // round(1.5) = 2, round(3.0) = 3
  EXPECT_EQ(box.top, 2);
  EXPECT_EQ(box.left, 3);
  EXPECT_THROW(data::center_crop_box(5, 8, 6), std::invalid_argument);
}

}  // namespace
}  // namespace mgbench
