#include "models/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/durable.h"
#include "core/error.h"
#include "core/input_file.h"
#include "models/json_file.h"
#include "models/safetensors_header.h"
#include "models/state_dict.h"

namespace mgbench::models {
namespace {

struct DtypeName {
  const char* name;
  torch::ScalarType type;
};
constexpr DtypeName kDtypes[] = {{"F64", torch::kFloat64},   {"F32", torch::kFloat32}, {"F16", torch::kFloat16},
                                 {"BF16", torch::kBFloat16}, {"I64", torch::kInt64},   {"I32", torch::kInt32},
                                 {"I16", torch::kInt16},     {"I8", torch::kInt8},     {"U8", torch::kUInt8},
                                 {"BOOL", torch::kBool}};

/// The LibTorch dtype of a safetensors dtype name that parse_safetensors_header accepted.
torch::ScalarType torch_dtype(const std::string& name) {
  const auto* found =
      std::find_if(std::begin(kDtypes), std::end(kDtypes), [&](const DtypeName& d) { return name == d.name; });
  if (found == std::end(kDtypes)) throw std::logic_error("safetensors dtype " + name + " without a LibTorch type");
  return found->type;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  require_regular_file(path, "safetensors");
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MGBENCH_REQUIRE(fd_ >= 0, DataError, "safetensors '{}': cannot open ({})", path, std::strerror(errno));
  try {
    struct stat st {};
    MGBENCH_REQUIRE(fstat(fd_, &st) == 0, DataError, "safetensors '{}': cannot stat ({})", path, std::strerror(errno));
    const auto file_size = static_cast<std::uint64_t>(st.st_size);
    // The length, then the JSON it announces (the parser bounds it by the file and 100 MiB).
    std::string head(std::min<std::uint64_t>(file_size, 8), '\0');
    read_bytes(0, head.size(), head.data(), "the header");
    if (head.size() == 8) {
      std::uint64_t header_bytes = 0;
      std::memcpy(&header_bytes, head.data(), 8);
      if (header_bytes <= file_size - 8 && header_bytes <= 100 * 1024 * 1024) {
        head.resize(8 + header_bytes);
        read_bytes(8, header_bytes, head.data() + 8, "the header");
      }
    }
    const SafetensorsHeader header = parse_safetensors_header(head, file_size, path);
    data_offset_ = header.data_offset;
    metadata_ = header.metadata;
    for (const auto& [name, e] : header.entries)
      entries_.emplace(name, Entry{torch_dtype(e.dtype), e.shape, e.begin, e.end});
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::pair<std::size_t, std::string>> order;
  for (const auto& [name, e] : entries_) order.emplace_back(e.begin, name);
  std::sort(order.begin(), order.end());
  std::vector<std::string> out;
  for (auto& [_, name] : order) out.push_back(std::move(name));
  return out;
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = entries_.find(name);
  MGBENCH_REQUIRE(it != entries_.end(), DataError, "safetensors '{}': no tensor '{}'", path_, name);
  return it->second;
}

const std::vector<std::int64_t>& SafetensorsFile::shape(const std::string& name) const { return entry(name).shape; }

torch::ScalarType SafetensorsFile::dtype(const std::string& name) const { return entry(name).dtype; }

void SafetensorsFile::read_bytes(std::size_t offset, std::size_t bytes, void* dst, const std::string& name) const {
  auto* out = static_cast<char*>(dst);
  // Header reads (offset from the file's start) pass data_offset_ 0: it is set after them.
  std::size_t at = data_offset_ + offset;
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, out, std::min<std::size_t>(bytes, std::size_t{1} << 30), static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    MGBENCH_REQUIRE(n > 0, DataError, "safetensors '{}': reading {} at byte {} failed ({})", path_, name, at,
                    n == 0 ? "the file ends early: was it shortened after it was opened?" : std::strerror(errno));
    out += n;
    at += static_cast<std::size_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
}

torch::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const Entry& e = entry(name);
  torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
  read_bytes(e.begin, e.end - e.begin, t.data_ptr(), fmt::format("tensor '{}'", name));
  return t;
}

void SafetensorsFile::read_rows(const std::string& name, std::int64_t first_row, const torch::Tensor& rows) const {
  const Entry& e = entry(name);
  const std::int64_t total = e.shape.empty() ? 1 : e.shape.front();
  const std::int64_t count = rows.dim() == 0 ? 1 : rows.size(0);
  const bool same_row_shape = rows.dim() == static_cast<std::int64_t>(e.shape.size()) &&
                              std::equal(e.shape.begin() + (e.shape.empty() ? 0 : 1), e.shape.end(),
                                         rows.sizes().begin() + (e.shape.empty() ? 0 : 1));
  MGBENCH_REQUIRE(same_row_shape && first_row >= 0 && first_row + count <= total, DataError,
                  "safetensors '{}': tensor '{}' is [{}]: rows {}..{} of shape [{}] do not fit it", path_, name,
                  fmt::join(e.shape, ", "), first_row, first_row + count, fmt::join(rows.sizes(), ", "));
  MGBENCH_REQUIRE(!rows.is_floating_point() || c10::isFloatingType(e.dtype), DataError,
                  "safetensors '{}': tensor '{}' is {}, read into {} weights: expected a float dtype (F32, BF16, F16, "
                  "F64)",
                  path_, name, c10::toString(e.dtype), c10::toString(rows.scalar_type()));
  const std::size_t row_bytes = total == 0 ? 0 : (e.end - e.begin) / static_cast<std::size_t>(total);
  const std::size_t offset = e.begin + static_cast<std::size_t>(first_row) * row_bytes;
  const std::size_t bytes = static_cast<std::size_t>(count) * row_bytes;
  const std::string what = fmt::format("rows {}..{} of tensor '{}'", first_row, first_row + count, name);
  if (rows.device().is_cpu() && rows.scalar_type() == e.dtype && rows.is_contiguous()) {
    read_bytes(offset, bytes, rows.data_ptr(), what);
    return;
  }
  torch::Tensor staged = torch::empty(rows.sizes(), torch::TensorOptions().dtype(e.dtype));
  read_bytes(offset, bytes, staged.data_ptr(), what);
  rows.copy_(staged);
}

std::string shadowing_index(const std::string& dir) {
  const std::filesystem::path index = std::filesystem::path(dir) / kSafetensorsIndexFile;
  std::error_code ec;
  if (!std::filesystem::exists(index, ec)) return "";
  return fmt::format(
      "it holds a sharded checkpoint's {}, which readers (mgbench, transformers) load instead of the "
      "model.safetensors written there: the new model would be shadowed by the old shards",
      index.string());
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  const fs::path index = fs::path(dir) / kSafetensorsIndexFile;
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index)) {
    const nlohmann::json j = read_json_file(index.string());
    MGBENCH_REQUIRE(j.contains("weight_map") && j["weight_map"].is_object(), DataError,
                    "'{}': no \"weight_map\" object", index.string());
    std::map<std::string, std::size_t> shard_index;
    for (const auto& [name, file] : j["weight_map"].items()) {
      MGBENCH_REQUIRE(file.is_string(), DataError, "'{}': weight_map[\"{}\"] is not a file name", index.string(), name);
      const std::string shard = file.get<std::string>();
      auto [it, inserted] = shard_index.emplace(shard, shards_.size());
      if (inserted) {
        const fs::path shard_path = fs::path(dir) / shard;
        MGBENCH_REQUIRE(fs::exists(shard_path), DataError, "'{}' lists shard '{}', which does not exist",
                        index.string(), shard_path.string());
        shards_.push_back(std::make_unique<SafetensorsFile>(shard_path.string()));
      }
      MGBENCH_REQUIRE(shards_[it->second]->contains(name), DataError, "'{}' maps '{}' to '{}', which lacks it",
                      index.string(), name, shard);
      shard_of_[name] = it->second;
    }
  } else {
    MGBENCH_REQUIRE(fs::exists(single), DataError,
                    "checkpoint '{}': neither model.safetensors nor model.safetensors.index.json found", dir);
    shards_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (const auto& name : shards_.front()->names()) shard_of_[name] = 0;
  }
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : shard_of_) out.push_back(name);
  return out;
}

const SafetensorsFile& SafetensorsCheckpoint::file(const std::string& name) const {
  const auto it = shard_of_.find(name);
  MGBENCH_REQUIRE(it != shard_of_.end(), DataError, "checkpoint '{}': no tensor '{}'", dir_, name);
  return *shards_[it->second];
}

torch::Tensor SafetensorsCheckpoint::tensor(const std::string& name) const { return file(name).tensor(name); }

const std::vector<std::int64_t>& SafetensorsCheckpoint::shape(const std::string& name) const {
  return file(name).shape(name);
}

void SafetensorsCheckpoint::read_rows(const std::string& name, std::int64_t first_row,
                                      const torch::Tensor& rows) const {
  file(name).read_rows(name, first_row, rows);
}

const std::string& SafetensorsCheckpoint::file_of(const std::string& name) const { return file(name).path(); }

namespace {

/// All of bytes at offset of fd (pwrite, in pieces). Throws DataError naming path.
void write_at(int fd, const void* data, std::size_t bytes, std::size_t offset, const std::string& path) {
  const auto* in = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, in, std::min<std::size_t>(bytes, std::size_t{1} << 30), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    MGBENCH_REQUIRE(n > 0, DataError, "safetensors '{}': write failed ({})", path, std::strerror(errno));
    in += n;
    offset += static_cast<std::size_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<Entry> entries,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), tmp_(path_ + ".tmp") {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (Entry& e : entries) {
    MGBENCH_REQUIRE(!slots_.count(e.name), std::invalid_argument, "safetensors '{}': tensor '{}' given twice", path_,
                    e.name);
    std::string name = e.name;
    slots_.emplace(std::move(name), Slot{std::move(e), 0, false});
  }
  std::size_t offset = 0;  // slots_ iterates names sorted
  for (auto& [name, slot] : slots_) {
    const auto* found = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                     [&](const DtypeName& d) { return d.type == slot.entry.dtype; });
    if (found == std::end(kDtypes)) {
      throw std::invalid_argument(
          fmt::format("safetensors '{}': tensor '{}' has dtype {}, which safetensors cannot hold", path_, name,
                      c10::toString(slot.entry.dtype)));
    }
    const std::size_t bytes =
        static_cast<std::size_t>(c10::multiply_integers(slot.entry.shape)) * c10::elementSize(slot.entry.dtype);
    header[name] = {{"dtype", found->name}, {"shape", slot.entry.shape}, {"data_offsets", {offset, offset + bytes}}};
    slot.offset = offset;
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data section 8-byte aligned (the reference pads with spaces)
  const std::uint64_t n = text.size();
  for (auto& [_, slot] : slots_) slot.offset += 8 + text.size();
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MGBENCH_REQUIRE(fd_ >= 0, DataError, "safetensors '{}': cannot create ({})", tmp_, std::strerror(errno));
  try {
    write_at(fd_, &n, 8, 0, tmp_);
    write_at(fd_, text.data(), text.size(), 8, tmp_);
    // Sized at once: a tensor written last still leaves no hole the size check of a reader trips on.
    MGBENCH_REQUIRE(::ftruncate(fd_, static_cast<off_t>(8 + text.size() + offset)) == 0, DataError,
                    "safetensors '{}': cannot size the file ({})", tmp_, std::strerror(errno));
  } catch (...) {
    discard();
    throw;
  }
}

void SafetensorsWriter::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  std::error_code ignored;
  std::filesystem::remove(tmp_, ignored);  // not committed: no partial file stays
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!committed_) discard();
}

void SafetensorsWriter::write(const std::string& name, const torch::Tensor& tensor) {
  const auto it = slots_.find(name);
  MGBENCH_REQUIRE(it != slots_.end(), std::invalid_argument, "safetensors '{}': tensor '{}' was not announced", path_,
                  name);
  Slot& slot = it->second;
  MGBENCH_REQUIRE(!slot.written, std::invalid_argument, "safetensors '{}': tensor '{}' written twice", path_, name);
  MGBENCH_REQUIRE(tensor.scalar_type() == slot.entry.dtype && tensor.sizes() == c10::IntArrayRef(slot.entry.shape),
                  std::invalid_argument, "safetensors '{}': tensor '{}' is {} {}, announced as {} {}", path_, name,
                  c10::toString(tensor.scalar_type()), shape_text(tensor.sizes()), c10::toString(slot.entry.dtype),
                  shape_text(slot.entry.shape));
  const torch::Tensor bytes = tensor.detach().to(torch::kCPU).contiguous();
  write_at(fd_, bytes.data_ptr(), bytes.nbytes(), slot.offset, tmp_);
  slot.written = true;
}

void SafetensorsWriter::commit() {
  for (const auto& [name, slot] : slots_) {
    MGBENCH_REQUIRE(slot.written, DataError, "safetensors '{}': tensor '{}' was never written", path_, name);
  }
  const int fd = fd_;
  fd_ = -1;  // closed once, whatever close says
  MGBENCH_REQUIRE(::close(fd) == 0, DataError, "safetensors '{}': write failed ({})", tmp_, std::strerror(errno));
  // On stable storage before it takes the final name: a node failure right after the rename
  // must not leave a complete-looking file with lost pages.
  sync_to_disk(tmp_);
  std::filesystem::rename(tmp_, path_);
  committed_ = true;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& [name, t] : tensors) entries.push_back({name, t.scalar_type(), t.sizes().vec()});
  SafetensorsWriter writer(path, std::move(entries), metadata);
  for (const auto& [name, t] : tensors) writer.write(name, t);
  writer.commit();
}

}  // namespace mgbench::models
