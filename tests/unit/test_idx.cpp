#include <zlib.h>

#include <filesystem>

#include "core/error.h"
#include "data/idx.h"
#include "data/mnist.h"
#include "test_support.h"

namespace mgbench::data {
namespace {

using test::TempDir;
using test::write_bytes;

std::vector<unsigned char> idx_bytes(int ndims, const std::vector<std::uint32_t>& dims, std::size_t data_bytes,
                                     unsigned char type = 0x08, unsigned char fill = 7) {
  std::vector<unsigned char> out = {0, 0, type, static_cast<unsigned char>(ndims)};
  for (auto d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<unsigned char>((d >> shift) & 0xff));
  }
  out.insert(out.end(), data_bytes, fill);
  return out;
}

void write_gz(const std::string& path, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

/// Expects read_idx_u8 to throw DataError naming the file and containing `needle`.
void expect_data_error(const std::string& path, int ndims, const std::string& needle) {
  test::expect_error<DataError>([&] { read_idx_u8(path, ndims); }, {path, needle});
}

// Found by tests/fuzz/fuzz_idx: the element count overflowed 64 bits (signed: undefined
// behaviour) before the size check could see it.
TEST(Idx, RefusesDimensionsWhoseProductOverflows) {
  TempDir dir;
  write_bytes(dir.file("huge"), idx_bytes(3, {0x80000000u, 0x80000000u, 0x80000000u}, 16));
  expect_data_error(dir.file("huge"), 3, "implausibly large (dimensions 2147483648 x 2147483648");
}

TEST(Idx, ReadsRawAndGzipAlike) {
  TempDir dir;
  const auto bytes = idx_bytes(3, {2, 3, 4}, 24);
  write_bytes(dir.file("raw"), bytes);
  write_gz(dir.file("z.gz"), bytes);
  for (const auto& name : {"raw", "z.gz"}) {
    const IdxArray a = read_idx_u8(dir.file(name), 3);
    EXPECT_EQ(a.dims, (std::vector<std::int64_t>{2, 3, 4}));
    ASSERT_EQ(a.data.size(), 24u);
    EXPECT_EQ(a.data[23], 7);
  }
}

TEST(Idx, RejectsBadMagicTypeAndDimensions) {
  TempDir dir;
  auto bad_magic = idx_bytes(3, {1, 2, 2}, 4);
  bad_magic[0] = 0x1f;  // not zero
  write_bytes(dir.file("magic"), bad_magic);
  expect_data_error(dir.file("magic"), 3, "magic");
  write_bytes(dir.file("type"), idx_bytes(3, {1, 2, 2}, 16, /*type=*/0x0d));
  expect_data_error(dir.file("type"), 3, "data type");
  write_bytes(dir.file("dims"), idx_bytes(1, {4}, 4));
  expect_data_error(dir.file("dims"), 3, "1 dimensions, expected 3");
  write_bytes(dir.file("zero"), idx_bytes(3, {0, 28, 28}, 0));
  expect_data_error(dir.file("zero"), 3, "size 0");
}

TEST(Idx, RejectsTruncatedAndTrailingData) {
  TempDir dir;
  auto bytes = idx_bytes(3, {10, 28, 28}, 7840);
  write_bytes(dir.file("short"), {bytes.begin(), bytes.end() - 100});
  expect_data_error(dir.file("short"), 3, "truncated");
  write_bytes(dir.file("header"), {bytes.begin(), bytes.begin() + 6});
  expect_data_error(dir.file("header"), 3, "truncated IDX header");
  auto longer = bytes;
  longer.push_back(1);
  write_bytes(dir.file("long"), longer);
  expect_data_error(dir.file("long"), 3, "trailing");
  write_bytes(dir.file("empty"), {});
  expect_data_error(dir.file("empty"), 3, "too short");
}

TEST(Idx, RejectsTruncatedAndCorruptGzip) {
  TempDir dir;
  write_gz(dir.file("full.gz"), idx_bytes(3, {100, 28, 28}, 78400, 0x08, 0));
  std::ifstream in(dir.file("full.gz"), std::ios::binary);
  std::vector<unsigned char> gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_bytes(dir.file("cut.gz"), {gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2)});
  EXPECT_THROW(read_idx_u8(dir.file("cut.gz"), 3), DataError);
  auto flipped = gz;
  for (std::size_t i = 20; i < flipped.size() - 8; i += 7) flipped[i] ^= 0x5a;
  write_bytes(dir.file("flip.gz"), flipped);
  EXPECT_THROW(read_idx_u8(dir.file("flip.gz"), 3), DataError);
}

TEST(Idx, MissingFileNamesThePath) { expect_data_error("/nonexistent/train-images-idx3-ubyte.gz", 3, "cannot open"); }

TEST(Mnist, ValidatesTheSplitAsAWhole) {
  TempDir dir;
  const auto load = [&] { load_mnist(dir.path(), Split::kTrain); };
  test::expect_error<DataError>([&] { load_mnist(dir.file("absent"), Split::kTrain); }, {"absent", "does not exist"});
  test::expect_error<DataError>(load, {"train-images-idx3-ubyte.gz"});
  write_bytes(dir.file("train-images-idx3-ubyte"), idx_bytes(3, {3, 28, 28}, 3 * 784));
  write_bytes(dir.file("train-labels-idx1-ubyte"), idx_bytes(1, {2}, 2, 0x08, 1));
  test::expect_error<DataError>(load, {"3 images but", "train-labels-idx1-ubyte"});
  write_bytes(dir.file("train-labels-idx1-ubyte"), idx_bytes(1, {3}, 3, 0x08, 11));
  test::expect_error<DataError>(load, {"label 11"});
  write_bytes(dir.file("train-labels-idx1-ubyte"), idx_bytes(1, {3}, 3, 0x08, 9));
  const MnistSplit split = load_mnist(dir.path(), Split::kTrain, /*limit=*/2);
  EXPECT_EQ(split.size(), 2);
  EXPECT_EQ(split.images.size(), 2u * 784u);
}

TEST(Mnist, ReadsTheRealFiles) {
  const std::string dir = test::shared_data_dir() + "/mnist";
  MGBENCH_REQUIRE_INPUTS(dir);
  const MnistSplit train = load_mnist(dir, Split::kTrain);
  const MnistSplit test = load_mnist(dir, Split::kTest);
  EXPECT_EQ(train.size(), 10000);  // the shared training file holds the first 10,000 images
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.rows, 28);
  EXPECT_EQ(train.cols, 28);
  EXPECT_EQ(train.images.size(), 10000u * 784u);
  // The first labels of the official files: train 5 0 4 1 9, test 7 2 1 0 4.
  EXPECT_EQ(std::vector<std::int64_t>(train.labels.begin(), train.labels.begin() + 5),
            (std::vector<std::int64_t>{5, 0, 4, 1, 9}));
  EXPECT_EQ(std::vector<std::int64_t>(test.labels.begin(), test.labels.begin() + 5),
            (std::vector<std::int64_t>{7, 2, 1, 0, 4}));
}

}  // namespace
}  // namespace mgbench::data
