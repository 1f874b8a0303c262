#include "models/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
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

struct SafetensorsFile::Mapping {
  void* data = MAP_FAILED;
  std::size_t size = 0;
  ~Mapping() {
    if (data != MAP_FAILED) munmap(data, size);
  }
  const char* bytes() const { return static_cast<const char*>(data); }
};

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), mapping_(std::make_shared<Mapping>()) {
  require_regular_file(path, "safetensors");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MGBENCH_REQUIRE(fd >= 0, DataError, "safetensors '{}': cannot open ({})", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    throw DataError(fmt::format("safetensors '{}': cannot stat ({})", path, std::strerror(errno)));
  }
  mapping_->size = static_cast<std::size_t>(st.st_size);
  if (mapping_->size >= 8) {
    // Copy-on-write: tensors are writable views, and writes never reach the file.
    mapping_->data = mmap(nullptr, mapping_->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  }
  ::close(fd);
  MGBENCH_REQUIRE(mapping_->size >= 8, DataError, "safetensors '{}': {} bytes, shorter than the 8-byte header length",
                  path, mapping_->size);
  MGBENCH_REQUIRE(mapping_->data != MAP_FAILED, DataError, "safetensors '{}': mmap failed ({})", path,
                  std::strerror(errno));

  const SafetensorsHeader header = parse_safetensors_header({mapping_->bytes(), mapping_->size}, path);
  data_offset_ = header.data_offset;
  metadata_ = header.metadata;
  for (const auto& [name, e] : header.entries)
    entries_.emplace(name, Entry{torch_dtype(e.dtype), e.shape, e.begin, e.end});
}

SafetensorsFile::~SafetensorsFile() = default;

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::pair<std::size_t, std::string>> order;
  for (const auto& [name, e] : entries_) order.emplace_back(e.begin, name);
  std::sort(order.begin(), order.end());
  std::vector<std::string> out;
  for (auto& [_, name] : order) out.push_back(std::move(name));
  return out;
}

torch::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const auto it = entries_.find(name);
  MGBENCH_REQUIRE(it != entries_.end(), DataError, "safetensors '{}': no tensor '{}'", path_, name);
  const Entry& e = it->second;
  char* data = const_cast<char*>(mapping_->bytes()) + data_offset_ + e.begin;
  const auto options = torch::TensorOptions().dtype(e.dtype);
  if (reinterpret_cast<std::uintptr_t>(data) % c10::elementSize(e.dtype) != 0) {
    // Unaligned data (allowed by the format, rare in practice): copy into aligned memory.
    torch::Tensor t = torch::empty(e.shape, options);
    std::memcpy(t.data_ptr(), data, e.end - e.begin);
    return t;
  }
  std::shared_ptr<Mapping> keep = mapping_;
  return torch::from_blob(
      data, e.shape, [keep](void*) mutable { keep.reset(); }, options);
}

void SafetensorsFile::release(const std::string& name) const {
  const auto it = entries_.find(name);
  MGBENCH_REQUIRE(it != entries_.end(), DataError, "safetensors '{}': no tensor '{}'", path_, name);
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(mapping_->bytes() + data_offset_ + it->second.begin);
  const auto end = reinterpret_cast<std::uintptr_t>(mapping_->bytes() + data_offset_ + it->second.end);
  // Whole pages only: a page shared with a neighbouring tensor stays.
  const std::uintptr_t first = (begin + page - 1) / page * page;
  const std::uintptr_t last = end / page * page;
  // Advice, not correctness: a kernel that refuses it leaves the pages resident.
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
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

torch::Tensor SafetensorsCheckpoint::tensor(const std::string& name) const {
  const auto it = shard_of_.find(name);
  MGBENCH_REQUIRE(it != shard_of_.end(), DataError, "checkpoint '{}': no tensor '{}'", dir_, name);
  return shards_[it->second]->tensor(name);
}

void SafetensorsCheckpoint::release(const std::string& name) const {
  const auto it = shard_of_.find(name);
  MGBENCH_REQUIRE(it != shard_of_.end(), DataError, "checkpoint '{}': no tensor '{}'", dir_, name);
  shards_[it->second]->release(name);
}

const std::string& SafetensorsCheckpoint::file_of(const std::string& name) const {
  const auto it = shard_of_.find(name);
  MGBENCH_REQUIRE(it != shard_of_.end(), DataError, "checkpoint '{}': no tensor '{}'", dir_, name);
  return shards_[it->second]->path();
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, torch::Tensor>> sorted;
  for (const auto& [name, t] : tensors) sorted.emplace_back(name, t.detach().to(torch::kCPU).contiguous());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::size_t offset = 0;
  for (const auto& [name, t] : sorted) {
    const auto* found = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                     [&](const DtypeName& d) { return d.type == t.scalar_type(); });
    if (found == std::end(kDtypes)) {
      throw std::invalid_argument(
          fmt::format("write_safetensors: tensor '{}' has dtype {}, which safetensors cannot hold", name,
                      c10::toString(t.scalar_type())));
    }
    const std::size_t bytes = static_cast<std::size_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", found->name}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data section 8-byte aligned (the reference pads with spaces)
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MGBENCH_REQUIRE(out.good(), DataError, "safetensors '{}': cannot create ({})", tmp, std::strerror(errno));
    const std::uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& [_, t] : sorted) {
      out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * t.element_size()));
    }
    out.flush();
    MGBENCH_REQUIRE(out.good(), DataError, "safetensors '{}': write failed ({})", tmp, std::strerror(errno));
  }
  // On stable storage before it takes the final name: a node failure right after the rename
  // must not leave a complete-looking file with lost pages.
  sync_to_disk(tmp);
  std::filesystem::rename(tmp, path);
}

}  // namespace mgbench::models
