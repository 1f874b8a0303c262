#pragma once
// MNIST-format datasets (MNIST, Fashion-MNIST) from a directory of IDX files, kept as uint8
// (28 x 28 = 784 B per image) in host memory.
#include <cstdint>
#include <string>
#include <vector>

namespace mgbench::data {

enum class Split { kTrain, kTest };

struct MnistSplit {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::vector<std::uint8_t> images;  // [N, rows, cols], row-major
  std::vector<std::int64_t> labels;  // [N], in [0, 9]
  std::string images_path;
  std::string labels_path;

  std::int64_t size() const { return static_cast<std::int64_t>(labels.size()); }
  std::int64_t image_bytes() const { return rows * cols; }
};

inline constexpr int kMnistClasses = 10;
/// Mean and standard deviation of the MNIST training pixels scaled to [0, 1] (torchvision's values).
inline constexpr double kMnistMean = 0.1307;
inline constexpr double kMnistStd = 0.3081;

/// Finds the split's files in dir under the standard names, gzip first:
/// {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (also the "images.idx3-ubyte" spelling).
/// limit > 0 keeps the first `limit` samples. Throws DataError naming the directory and the
/// names tried when a file is missing, or naming the file when it is invalid (bad magic,
/// counts of images and labels differ, a label outside 0-9).
MnistSplit load_mnist(const std::string& dir, Split split, std::int64_t limit = 0);

}  // namespace mgbench::data
