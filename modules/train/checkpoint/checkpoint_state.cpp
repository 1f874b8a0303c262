#include "train/checkpoint/checkpoint_state.h"

#include <zlib.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <sstream>

#include <ATen/Context.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "models/safetensors.h"

namespace mgbench::train {

// --- CheckpointState --------------------------------------------------------------------------

CheckpointState::CheckpointState() = default;
CheckpointState::CheckpointState(const std::string& path)
    : source_(path), file_(std::make_unique<models::SafetensorsFile>(path)) {
  metadata_ = file_->metadata();
}
CheckpointState::~CheckpointState() = default;
CheckpointState::CheckpointState(CheckpointState&&) noexcept = default;
CheckpointState& CheckpointState::operator=(CheckpointState&&) noexcept = default;

void CheckpointState::put(const std::string& name, const torch::Tensor& tensor) {
  // One copy, also for a CPU tensor (the state must not change with later training steps).
  tensors_.emplace_back(name, tensor.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous());
}
void CheckpointState::put(const std::string& key, std::int64_t value) { metadata_[key] = std::to_string(value); }
void CheckpointState::put(const std::string& key, double value) { metadata_[key] = fmt::format("{:.17g}", value); }
void CheckpointState::put_text(const std::string& key, const std::string& value) { metadata_[key] = value; }

void CheckpointState::put_bytes(const std::string& name, const void* data, std::size_t bytes, std::size_t record_size) {
  torch::Tensor t = torch::empty({static_cast<std::int64_t>(bytes)}, torch::kUInt8);
  if (bytes > 0) std::memcpy(t.data_ptr(), data, bytes);
  tensors_.emplace_back(name, t);
  put(name + ".record_bytes", static_cast<std::int64_t>(record_size));
}

bool CheckpointState::contains(const std::string& name) const {
  if (file_) return file_->contains(name);
  return std::any_of(tensors_.begin(), tensors_.end(), [&](const auto& e) { return e.first == name; });
}

namespace {

/// CRC-32 (zlib's) of a contiguous CPU tensor's bytes, as 8 hex digits.
std::string crc32_hex(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* bytes = static_cast<const Bytef*>(c.data_ptr());
  std::size_t left = static_cast<std::size_t>(c.numel()) * c.element_size();
  while (left > 0) {  // zlib takes uInt lengths
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(left, 1u << 30));
    crc = crc32(crc, bytes, chunk);
    bytes += chunk;
    left -= chunk;
  }
  return fmt::format("{:08x}", static_cast<std::uint32_t>(crc));
}

}  // namespace

torch::Tensor CheckpointState::tensor(const std::string& name) const {
  if (file_) {
    MGBENCH_REQUIRE(file_->contains(name), DataError, "checkpoint '{}' has no tensor '{}'", source_, name);
    torch::Tensor t = file_->tensor(name);
    if (const auto stored = metadata_.find("crc32:" + name); stored != metadata_.end()) {
      const std::string read = crc32_hex(t);
      MGBENCH_REQUIRE(read == stored->second, DataError,
                      "checkpoint '{}': tensor '{}' fails its CRC-32 check (stored {}, read {}): the file is damaged; "
                      "resume from an older checkpoint or start again",
                      source_, name, stored->second, read);
    }
    return t;
  }
  for (const auto& [n, t] : tensors_) {
    if (n == name) return t;
  }
  throw DataError(fmt::format("checkpoint state has no tensor '{}'", name));
}

const std::string& CheckpointState::meta(const std::string& key) const {
  const auto it = metadata_.find(key);
  MGBENCH_REQUIRE(it != metadata_.end(), DataError, "checkpoint '{}' has no entry '{}' in its metadata", source_, key);
  return it->second;
}

std::int64_t CheckpointState::integer(const std::string& key) const {
  const std::string& v = meta(key);
  try {
    std::size_t used = 0;
    const long long value = std::stoll(v, &used);
    if (used == v.size()) return value;
  } catch (const std::exception&) {
  }
  throw DataError(fmt::format("checkpoint '{}': metadata '{}' = '{}' is not an integer", source_, key, v));
}

double CheckpointState::number(const std::string& key) const {
  const std::string& v = meta(key);
  try {
    std::size_t used = 0;
    const double value = std::stod(v, &used);
    if (used == v.size()) return value;
  } catch (const std::exception&) {
  }
  throw DataError(fmt::format("checkpoint '{}': metadata '{}' = '{}' is not a number", source_, key, v));
}

std::string CheckpointState::text(const std::string& key) const { return meta(key); }

torch::Tensor CheckpointState::record_bytes(const std::string& name, std::size_t record_size) const {
  const std::int64_t stored = integer(name + ".record_bytes");
  MGBENCH_REQUIRE(stored == static_cast<std::int64_t>(record_size), DataError,
                  "checkpoint '{}': records '{}' are {} bytes each, this build's are {} (written by another mgbench "
                  "version; start the run afresh)",
                  source_, name, stored, record_size);
  torch::Tensor bytes = tensor(name).contiguous();
  MGBENCH_REQUIRE(bytes.scalar_type() == torch::kUInt8 && bytes.numel() % static_cast<std::int64_t>(record_size) == 0,
                  DataError, "checkpoint '{}': records '{}' are not a whole number of {}-byte rows", source_, name,
                  record_size);
  return bytes;
}

void CheckpointState::write(const std::string& path, std::optional<int> rank) const {
  std::map<std::string, std::string> metadata = metadata_;
  for (const auto& [name, t] : tensors_) metadata["crc32:" + name] = crc32_hex(t);
  if (rank) metadata["rank"] = std::to_string(*rank);
  models::write_safetensors(path, tensors_, metadata);
}

void CheckpointState::check_rank(int rank) const {
  const auto it = metadata_.find("rank");
  if (it == metadata_.end()) return;  // written before ranks were recorded
  MGBENCH_REQUIRE(
      it->second == std::to_string(rank), DataError,
      "checkpoint '{}' was written by rank {}, not rank {}: a checkpoint's rank files must stay where their "
      "ranks wrote them",
      source_, it->second, rank);
}

// --- state helpers ------------------------------------------------------------------------------

void put_module(CheckpointState& state, const std::string& prefix, torch::nn::Module& module) {
  for (const auto& p : module.named_parameters()) state.put(prefix + p.key(), p.value());
  for (const auto& b : module.named_buffers()) state.put(prefix + b.key(), b.value());
}

void load_module(const CheckpointState& state, const std::string& prefix, torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> all;
  for (const auto& p : module.named_parameters()) all.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers()) all.emplace_back(b.key(), b.value());
  load_tensors(state, prefix, all);
}

void put_tensors(CheckpointState& state, const std::string& prefix,
                 const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  for (const auto& [name, t] : tensors) state.put(prefix + name, t);
}

void load_tensors(const CheckpointState& state, const std::string& prefix,
                  const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, target] : tensors) {
    const torch::Tensor stored = state.tensor(prefix + name);
    MGBENCH_REQUIRE(stored.sizes() == target.sizes() && stored.scalar_type() == target.scalar_type(), DataError,
                    "checkpoint '{}': '{}{}' is {} {}, the model's is {} {}", state.source(), prefix, name,
                    c10::toString(stored.scalar_type()), fmt::join(stored.sizes(), "x"),
                    c10::toString(target.scalar_type()), fmt::join(target.sizes(), "x"));
    const_cast<torch::Tensor&>(target).copy_(stored);
  }
}

void put_optimizer(CheckpointState& state, const std::string& name, torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  const std::string data = bytes.str();
  state.put_records<char>(name, std::span<const char>(data.data(), data.size()));
}

void load_optimizer(const CheckpointState& state, const std::string& name, torch::optim::Optimizer& optimizer) {
  const std::vector<char> data = state.records<char>(name);
  std::optional<torch::Device> device;
  if (!optimizer.param_groups().empty() && !optimizer.param_groups()[0].params().empty()) {
    device = optimizer.param_groups()[0].params()[0].device();
  }
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(data.data(), data.size(), device);
    optimizer.load(archive);
  } catch (const c10::Error& e) {
    throw DataError(fmt::format("checkpoint '{}': optimizer state '{}' does not fit this optimizer: {}", state.source(),
                                name, e.what_without_backtrace()));
  }
}

void put_rng(CheckpointState& state, const torch::Device& device) {
  {
    at::Generator cpu = at::globalContext().defaultGenerator(torch::kCPU);
    std::lock_guard<std::mutex> lock(cpu.mutex());
    state.put("rng/cpu", cpu.get_state());
  }
  if (device.is_cuda()) {
    at::Generator gpu = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gpu.mutex());
    state.put("rng/cuda", gpu.get_state());
  }
}

void load_rng(const CheckpointState& state, const torch::Device& device) {
  {
    at::Generator cpu = at::globalContext().defaultGenerator(torch::kCPU);
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_state(state.tensor("rng/cpu").clone());
  }
  if (device.is_cuda()) {
    at::Generator gpu = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gpu.mutex());
    gpu.set_state(state.tensor("rng/cuda").clone());
  }
}

}  // namespace mgbench::train
