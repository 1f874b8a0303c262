#include "data/mnist.h"

#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/input_file.h"
#include "data/idx.h"

namespace mgbench::data {
namespace {

/// kind: "images-idx3" or "labels-idx1". Both spellings in use are tried, gzip first.
std::string find_file(const std::string& dir, const std::string& prefix, const std::string& kind) {
  namespace fs = std::filesystem;
  std::string dotted = kind;
  dotted[dotted.find('-')] = '.';
  std::vector<std::string> tried;
  for (const std::string& stem : {prefix + "-" + kind + "-ubyte", prefix + "-" + dotted + "-ubyte"}) {
    for (const char* suffix : {".gz", ""}) {
      const fs::path p = fs::path(dir) / (stem + suffix);
      tried.push_back(p.filename().string());
      if (fs::exists(p)) {
        require_regular_file(p.string(), "IDX file");  // a FIFO of that name: refused, not skipped
        return p.string();
      }
    }
  }
  throw DataError(fmt::format("{}: no {} file of the {} split found (tried {})", dir, kind.substr(0, kind.find('-')),
                              prefix, fmt::join(tried, ", ")));
}

}  // namespace

MnistSplit load_mnist(const std::string& dir, Split split, std::int64_t limit) {
  std::error_code ec;
  MGBENCH_REQUIRE(std::filesystem::exists(dir, ec), DataError, "data directory '{}' does not exist", dir);
  MGBENCH_REQUIRE(std::filesystem::is_directory(dir, ec), DataError,
                  "data directory '{}': a file, not a directory (expected the directory holding the IDX files "
                  "train-images-idx3-ubyte[.gz], ...)",
                  dir);
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  MnistSplit out;
  out.images_path = find_file(dir, prefix, "images-idx3");
  out.labels_path = find_file(dir, prefix, "labels-idx1");
  IdxArray images = read_idx_u8(out.images_path, 3);
  IdxArray labels = read_idx_u8(out.labels_path, 1);
  MGBENCH_REQUIRE(images.dims[0] == labels.dims[0], DataError, "{} holds {} images but {} holds {} labels",
                  out.images_path, images.dims[0], out.labels_path, labels.dims[0]);
  std::int64_t n = images.dims[0];
  if (limit > 0 && limit < n) n = limit;
  out.rows = images.dims[1];
  out.cols = images.dims[2];
  images.data.resize(static_cast<std::size_t>(n * out.rows * out.cols));
  out.images = std::move(images.data);
  out.labels.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const int label = labels.data[static_cast<std::size_t>(i)];
    MGBENCH_REQUIRE(label < kMnistClasses, DataError, "{}: label {} of sample {} is outside 0-{}", out.labels_path,
                    label, i, kMnistClasses - 1);
    out.labels.push_back(label);
  }
  return out;
}

}  // namespace mgbench::data
