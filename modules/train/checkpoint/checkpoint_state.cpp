#include "train/checkpoint/checkpoint_state.h"

#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <mutex>
#include <optional>
#include <stdexcept>

#include <ATen/Context.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "models/parameter_units.h"
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
namespace {

constexpr const char* kShardKey = "shard:";  // metadata "shard:<name>" = the whole shape, "d0,d1,..."

}  // namespace

void CheckpointState::put_shard(const std::string& name, const torch::Tensor& shard, at::IntArrayRef whole,
                                int world_size) {
  const models::ShardLayout layout = models::ShardLayout::of(whole, world_size);
  if (shard.sizes() != at::IntArrayRef(layout.shard_sizes())) {
    throw std::invalid_argument(fmt::format("put_shard '{}': a shard of {} over {} rank(s) is {}, not {}", name,
                                            fmt::join(whole, "x"), world_size, fmt::join(layout.shard_sizes(), "x"),
                                            fmt::join(shard.sizes(), "x")));
  }
  put(name, shard);
  metadata_[kShardKey + name] = fmt::format("{}", fmt::join(whole, ","));
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

std::vector<std::string> CheckpointState::names() const {
  if (file_) return file_->names();
  std::vector<std::string> out;
  for (const auto& entry : tensors_) out.push_back(entry.first);
  return out;
}

std::optional<std::vector<std::int64_t>> CheckpointState::whole_shape(const std::string& name) const {
  const auto it = metadata_.find(kShardKey + name);
  if (it == metadata_.end()) return std::nullopt;
  const std::string& text = it->second;
  std::vector<std::int64_t> sizes;
  for (const char* p = text.data(); p <= text.data() + text.size(); ++p) {  // "d0,d1,...": one number per comma
    std::int64_t size = -1;
    const auto [end, error] = std::from_chars(p, text.data() + text.size(), size);
    MGBENCH_REQUIRE(error == std::errc() && size >= 0 && (end == text.data() + text.size() || *end == ','), DataError,
                    "checkpoint '{}': the whole shape of '{}' is '{}', not sizes separated by commas", source_, name,
                    text);
    sizes.push_back(size);
    p = end;
  }
  return sizes;
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

std::vector<CheckpointTensor> module_tensors(torch::nn::Module& module) {
  std::vector<CheckpointTensor> out;
  for (const auto& p : module.named_parameters()) out.push_back({p.key(), p.value(), {}});
  for (const auto& b : module.named_buffers()) out.push_back({b.key(), b.value(), {}});
  return out;
}

void put_module(CheckpointState& state, const std::string& prefix, torch::nn::Module& module) {
  put_tensors(state, prefix, module_tensors(module), 1);
}

void load_module(const CheckpointState& state, const std::string& prefix, torch::nn::Module& module) {
  load_tensors(state, prefix, module_tensors(module));
}

namespace {

/// Stores t as name, a shard as its parameter's (whole non-empty) is.
void put_like(CheckpointState& state, const std::string& name, const torch::Tensor& t, const CheckpointTensor& param,
              int world_size) {
  if (param.whole.empty()) {
    state.put(name, t);
  } else {
    state.put_shard(name, t, param.whole, world_size);
  }
}

/// Whether the optimizer's states are AdamW's (else SGD's). Throws std::logic_error for another kind:
/// only these two are checkpointed (make_optimizer builds no other).
bool is_adamw(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr) return true;
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr) return false;
  throw std::logic_error("checkpoint: only AdamW and SGD optimizer states are checkpointed");
}

/// The stored tensor `name`, checked to have target's shape (and its dtype where same_dtype).
torch::Tensor stored_like(const CheckpointState& state, const std::string& name, const torch::Tensor& target,
                          bool same_dtype) {
  const torch::Tensor stored = state.tensor(name);
  MGBENCH_REQUIRE(stored.sizes() == target.sizes() && (!same_dtype || stored.scalar_type() == target.scalar_type()),
                  DataError, "checkpoint '{}': '{}' is {} {}, this run's is {} {}", state.source(), name,
                  c10::toString(stored.scalar_type()), fmt::join(stored.sizes(), "x"),
                  c10::toString(target.scalar_type()), fmt::join(target.sizes(), "x"));
  return stored;
}

}  // namespace

void put_tensors(CheckpointState& state, const std::string& prefix, const std::vector<CheckpointTensor>& tensors,
                 int world_size) {
  for (const CheckpointTensor& t : tensors) put_like(state, prefix + t.name, t.local, t, world_size);
}

void load_tensors(const CheckpointState& state, const std::string& prefix,
                  const std::vector<CheckpointTensor>& tensors) {
  torch::NoGradGuard no_grad;
  for (const CheckpointTensor& t : tensors) {
    const torch::Tensor stored = stored_like(state, prefix + t.name, t.local, /*same_dtype=*/true);
    const_cast<torch::Tensor&>(t.local).copy_(stored);
  }
}

void put_optimizer(CheckpointState& state, const std::string& prefix, torch::optim::Optimizer& optimizer,
                   const std::vector<CheckpointTensor>& params, int world_size) {
  const bool adamw = is_adamw(optimizer);
  for (const CheckpointTensor& p : params) {
    const auto it = optimizer.state().find(p.local.unsafeGetTensorImpl());
    if (it == optimizer.state().end()) continue;
    const std::string name = prefix + p.name + "/";
    if (adamw) {
      const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      state.put(name + "step", s.step());
      put_like(state, name + "exp_avg", s.exp_avg(), p, world_size);
      put_like(state, name + "exp_avg_sq", s.exp_avg_sq(), p, world_size);
      if (s.max_exp_avg_sq().defined()) put_like(state, name + "max_exp_avg_sq", s.max_exp_avg_sq(), p, world_size);
    } else {
      const auto& s = static_cast<const torch::optim::SGDParamState&>(*it->second);
      if (s.momentum_buffer().defined()) put_like(state, name + "momentum_buffer", s.momentum_buffer(), p, world_size);
    }
  }
}

void load_optimizer(const CheckpointState& state, const std::string& prefix, torch::optim::Optimizer& optimizer,
                    const std::vector<CheckpointTensor>& params) {
  const bool adamw = is_adamw(optimizer);
  auto restored = [&](const std::string& name, const torch::Tensor& param) {
    return stored_like(state, name, param, /*same_dtype=*/false)
        .to(param.device(), /*non_blocking=*/false, /*copy=*/true);
  };
  for (const CheckpointTensor& p : params) {
    const std::string name = prefix + p.name + "/";
    void* key = p.local.unsafeGetTensorImpl();
    optimizer.state().erase(key);
    if (adamw && state.contains(name + "exp_avg")) {
      auto s = std::make_unique<torch::optim::AdamWParamState>();
      s->step(state.integer(name + "step"));
      s->exp_avg(restored(name + "exp_avg", p.local));
      s->exp_avg_sq(restored(name + "exp_avg_sq", p.local));
      if (state.contains(name + "max_exp_avg_sq")) s->max_exp_avg_sq(restored(name + "max_exp_avg_sq", p.local));
      optimizer.state()[key] = std::move(s);
    } else if (!adamw && state.contains(name + "momentum_buffer")) {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(restored(name + "momentum_buffer", p.local));
      optimizer.state()[key] = std::move(s);
    }
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
