#pragma once
// Hugging Face safetensors checkpoints (github huggingface/safetensors, format spec in its
// README): an 8-byte little-endian header length N, N bytes of JSON
// {"<name>": {"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the raw little-endian tensor bytes, offsets relative to the end of the header.
// Files are memory-mapped; tensors are views of the mapping (copy-on-write, so an accidental write
// never reaches the file) that keep it alive.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

namespace mgbench::models {

class SafetensorsFile {
 public:
  /// Maps path and validates the header: size, JSON, known dtypes (F64, F32, F16, BF16, I64, I32,
  /// I16, I8, U8, BOOL), shape x element size = byte length, offsets inside the data section.
  /// Throws DataError naming the file (and the tensor) for a missing, truncated or malformed file.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  /// Tensor names in file order of their data.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  /// The tensor as a CPU view of the mapping (dtype and shape from the header). Throws DataError
  /// for an unknown name.
  torch::Tensor tensor(const std::string& name) const;
  /// Gives the pages of name's data back to the kernel (madvise MADV_DONTNEED on the whole pages
  /// inside its byte range): once a tensor was copied, converted or quantised, the file stops
  /// counting in the process's resident memory. A view tensor() returned earlier reads the file
  /// again if used; one written in place would lose the writes (copy-on-write pages are dropped):
  /// call it only when no such view is used any more. Throws DataError for an unknown name.
  void release(const std::string& name) const;
  /// "__metadata__" (string -> string), empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    torch::ScalarType dtype;
    std::vector<std::int64_t> shape;
    std::size_t begin = 0;  // offset in the data section
    std::size_t end = 0;
  };
  struct Mapping;
  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  std::size_t data_offset_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// A Hugging Face checkpoint directory: `model.safetensors`, or shards listed by
/// `model.safetensors.index.json` ({"weight_map": {name: shard file}}). Throws DataError naming
/// the directory or file when neither exists, the index is malformed or a shard is missing.
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& dir);
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return shard_of_.count(name) != 0; }
  /// Throws DataError naming the checkpoint for an unknown name.
  torch::Tensor tensor(const std::string& name) const;
  /// SafetensorsFile::release of name's shard: call once name's values live elsewhere.
  void release(const std::string& name) const;
  /// File that holds name (for error messages).
  const std::string& file_of(const std::string& name) const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, std::size_t> shard_of_;
};

/// Writes tensors (any device; contiguous copies are made on the CPU) to path in the
/// safetensors format, names sorted, data 8-byte aligned, with optional metadata. The file is
/// written to path + ".tmp" and renamed, so readers never see a partial file. Throws DataError
/// naming the file on I/O errors and std::invalid_argument for dtypes safetensors cannot hold.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace mgbench::models
