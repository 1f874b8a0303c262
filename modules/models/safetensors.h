#pragma once
// Hugging Face safetensors checkpoints (github huggingface/safetensors, format spec in its
// README): an 8-byte little-endian header length N, N bytes of JSON
// {"<name>": {"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the raw little-endian tensor bytes, offsets relative to the end of the header.
// Files are read with pread into the caller's memory, not mapped: a tensor read is the caller's own
// copy, and a rank of a sharded model reads only its rows of each tensor (read_rows), so no page
// of the file stays resident in the process once its bytes were copied.
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
  /// Opens path and validates the header: size, JSON, known dtypes (F64, F32, F16, BF16, I64, I32,
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
  /// The tensor's shape and dtype as the header gives them. Throw DataError for an unknown name.
  const std::vector<std::int64_t>& shape(const std::string& name) const;
  torch::ScalarType dtype(const std::string& name) const;
  /// The whole tensor, read into a new contiguous CPU tensor (the header's dtype and shape). Throws
  /// DataError for an unknown name or a failed read.
  torch::Tensor tensor(const std::string& name) const;
  /// Reads rows [first_row, first_row + rows.size(0)) of the tensor's dim 0 into `rows` ([n, the
  /// tensor's other dims], any device and floating dtype: converted as Tensor::copy_ converts).
  /// Rows of a row-major tensor are one byte range: pread straight into `rows` when it is a
  /// contiguous CPU tensor of the file's dtype, else through one host buffer of the range. Throws
  /// DataError naming the file and tensor when the rows or the shape do not fit it, an integer or
  /// bool tensor is read into float rows, or the read fails (a file shortened since it was opened).
  void read_rows(const std::string& name, std::int64_t first_row, const torch::Tensor& rows) const;
  /// "__metadata__" (string -> string), empty when absent.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    torch::ScalarType dtype;
    std::vector<std::int64_t> shape;
    std::size_t begin = 0;  // offset in the data section
    std::size_t end = 0;
  };
  const Entry& entry(const std::string& name) const;
  /// bytes bytes at offset `offset` of the data section into dst (pread, in pieces). Throws DataError.
  void read_bytes(std::size_t offset, std::size_t bytes, void* dst, const std::string& name) const;
  std::string path_;
  int fd_ = -1;
  std::size_t data_offset_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// A sharded Hugging Face checkpoint's index: {"weight_map": {name: shard file}}.
inline constexpr const char* kSafetensorsIndexFile = "model.safetensors.index.json";

/// Why `dir` cannot take a single-file checkpoint (model.safetensors) written there: it holds a
/// sharded one's index (model.safetensors.index.json), which readers prefer -- SafetensorsCheckpoint
/// as transformers' from_pretrained -- so the new model would be shadowed by the old shards. "" when
/// it can (no index, or no directory yet).
std::string shadowing_index(const std::string& dir);

/// A Hugging Face checkpoint directory: `model.safetensors`, or shards listed by
/// `model.safetensors.index.json` ({"weight_map": {name: shard file}}). Throws DataError naming
/// the directory or file when neither exists, the index is malformed or a shard is missing.
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& dir);
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return shard_of_.count(name) != 0; }
  /// SafetensorsFile's tensor, shape and read_rows of the shard that holds name. Throw DataError
  /// naming the checkpoint for an unknown name.
  torch::Tensor tensor(const std::string& name) const;
  const std::vector<std::int64_t>& shape(const std::string& name) const;
  void read_rows(const std::string& name, std::int64_t first_row, const torch::Tensor& rows) const;
  /// File that holds name (for error messages).
  const std::string& file_of(const std::string& name) const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, std::size_t> shard_of_;
  const SafetensorsFile& file(const std::string& name) const;
};

/// A safetensors file written a tensor at a time, in any order: its header is laid out up front from
/// the tensors' names, dtypes and shapes (names sorted, data 8-byte aligned after the header), and
/// each tensor's bytes go to their offset when the caller has them (pwrite) -- an export of a sharded
/// model writes each unit's tensors while that unit is gathered, never holding the model whole. The
/// file is written as path + ".tmp" and renamed by commit() once every tensor is in, synced first,
/// so readers never see a partial file; destroyed uncommitted, the ".tmp" is removed.
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    torch::ScalarType dtype;
    std::vector<std::int64_t> shape;
  };
  /// Creates path + ".tmp" and writes the header. Throws std::invalid_argument for a dtype
  /// safetensors cannot hold or a name given twice, DataError naming the file on I/O errors.
  SafetensorsWriter(std::string path, std::vector<Entry> entries, const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  /// Writes tensor `name` (any device and layout; a contiguous CPU copy is made when needed). Throws
  /// std::invalid_argument for a name not announced, written already, or of another dtype or shape,
  /// DataError naming the file on I/O errors.
  void write(const std::string& name, const torch::Tensor& tensor);
  /// Syncs the file and gives it its name. Throws DataError naming the file and the first tensor not
  /// written, or on I/O errors.
  void commit();

 private:
  struct Slot {
    Entry entry;
    std::size_t offset = 0;  // from the file's start
    bool written = false;
  };
  /// Closes the file if open and removes the ".tmp" (a writer not committed).
  void discard() noexcept;
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
  std::map<std::string, Slot> slots_;
};

/// Writes tensors (any device; contiguous copies are made on the CPU) to path in the safetensors
/// format, names sorted, data 8-byte aligned, with optional metadata (SafetensorsWriter, the tensors
/// given at once). Throws DataError naming the file on I/O errors and std::invalid_argument for
/// dtypes safetensors cannot hold.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace mgbench::models
