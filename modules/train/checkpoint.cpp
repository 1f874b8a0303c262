#include "train/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include <ATen/Context.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/build_info.h"
#include "core/durable.h"
#include "core/error.h"
#include "core/log.h"
#include "core/mpi_strings.h"
#include "core/timer.h"
#include "models/safetensors.h"
#include "train/job_support.h"

namespace mgbench::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kManifestFile = "checkpoint.json";
constexpr const char* kFormat = "mgbench-checkpoint";
constexpr int kFormatVersion = 1;

std::string step_dir_name(std::int64_t global_step) { return fmt::format("step-{:09d}", global_step); }

std::string rank_file_name(int rank) { return fmt::format("rank-{:05d}.safetensors", rank); }

/// The global step of a complete checkpoint directory name, or -1 (".partial" and others).
std::int64_t parse_step_dir(const std::string& name) {
  if (name.size() != 14 || name.rfind("step-", 0) != 0) return -1;
  std::int64_t step = 0;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

nlohmann::json to_json(const CheckpointManifest& m) {
  return {{"format", kFormat},
          {"format_version", kFormatVersion},
          {"task", m.task},
          {"config_id", m.config_id},
          {"config", m.config},
          {"world_size", m.world_size},
          {"global_step", m.global_step},
          {"epoch", m.epoch},
          {"completed", m.completed},
          {"results", m.results},
          {"run_id", m.run_id},
          {"stop_signal", m.stop_signal},
          {"written_utc", m.written_utc},
          {"mgbench_version", build_info::kVersion},
          {"git_commit", build_info::kGitCommit}};
}

CheckpointManifest manifest_from_json(const std::string& text, const std::string& file) {
  CheckpointManifest m;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    MGBENCH_REQUIRE(j.value("format", "") == kFormat && j.value("format_version", 0) == kFormatVersion, DataError,
                    "checkpoint manifest '{}': not an mgbench checkpoint of format version {}", file, kFormatVersion);
    m.task = j.at("task").get<std::string>();
    m.config_id = j.at("config_id").get<std::string>();
    m.config = j.at("config").get<std::string>();
    m.world_size = j.at("world_size").get<std::int64_t>();
    m.global_step = j.at("global_step").get<std::int64_t>();
    m.epoch = j.at("epoch").get<std::int64_t>();
    m.completed = j.at("completed").get<bool>();
    m.results = j.at("results").get<std::string>();
    m.run_id = j.at("run_id").get<std::string>();
    m.stop_signal = j.value("stop_signal", "");
    m.written_utc = j.value("written_utc", "");
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("checkpoint manifest '{}' is malformed: {}", file, e.what()));
  }
  return m;
}

void write_text_file(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    MGBENCH_REQUIRE(out.good(), DataError, "checkpoint: cannot write '{}' ({})", path, std::strerror(errno));
  }
  sync_to_disk(path);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MGBENCH_REQUIRE(in.good(), DataError, "checkpoint: cannot read '{}' ({})", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

void CheckpointOptions::validate() const {
  MGBENCH_REQUIRE(every_steps >= 0, ConfigError, "--checkpoint-every {}: expected >= 0 (0: only at a stop and the end)",
                  every_steps);
  MGBENCH_REQUIRE(!dir.empty() || (every_steps == 0 && !resume), ConfigError,
                  "--checkpoint-every and --resume need --checkpoint-dir (where the checkpoints are)");
}

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

torch::Tensor CheckpointState::tensor(const std::string& name) const {
  if (file_) {
    MGBENCH_REQUIRE(file_->contains(name), DataError, "checkpoint '{}' has no tensor '{}'", source_, name);
    return file_->tensor(name);
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

void CheckpointState::write(const std::string& path) const { models::write_safetensors(path, tensors_, metadata_); }

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

std::string config_id(const std::string& config_text) {
  const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(config_text.data()),
                          static_cast<uInt>(config_text.size()));
  return fmt::format("{:08x}", static_cast<std::uint32_t>(crc));
}

// --- Checkpointer -------------------------------------------------------------------------------

Checkpointer::Checkpointer(CheckpointOptions options, runtime::MpiEnvironment& env, std::string task,
                           std::string config_text)
    : options_(std::move(options)), env_(env), task_(std::move(task)), config_(std::move(config_text)) {
  options_.validate();
  config_id_ = config_id(config_);
  if (enabled()) directory_ = (fs::path(options_.dir) / (task_ + "-" + config_id_)).string();
}

CheckpointManifest Checkpointer::manifest(std::int64_t global_step, std::int64_t epoch, bool completed) const {
  CheckpointManifest m;
  m.task = task_;
  m.config_id = config_id_;
  m.config = config_;
  m.world_size = env_.world_size();
  m.global_step = global_step;
  m.epoch = epoch;
  m.completed = completed;
  return m;
}

std::optional<CheckpointManifest> Checkpointer::latest() {
  // Rank 0 answers with "" (none), "M" + manifest JSON + '\n' + path, or "E" + error.
  std::string answer;
  if (env_.rank() == 0 && enabled()) {
    try {
      std::int64_t best = -1;
      fs::path best_dir;
      std::error_code ec;
      if (fs::is_directory(directory_, ec)) {
        for (const auto& entry : fs::directory_iterator(directory_)) {
          const std::int64_t step = parse_step_dir(entry.path().filename().string());
          if (step > best && fs::exists(entry.path() / kManifestFile)) {
            best = step;
            best_dir = entry.path();
          }
        }
      }
      if (best >= 0) answer = "M" + read_text_file((best_dir / kManifestFile).string()) + '\n' + best_dir.string();
    } catch (const std::exception& e) {
      answer = std::string("E") + e.what();
    }
  }
  answer = broadcast_string(env_.world(), answer);
  if (answer.empty()) return std::nullopt;
  if (answer[0] == 'E') throw DataError(answer.substr(1));
  const std::size_t split = answer.rfind('\n');
  const std::string dir = answer.substr(split + 1);
  CheckpointManifest m = manifest_from_json(answer.substr(1, split - 1), (fs::path(dir) / kManifestFile).string());
  m.path = dir;
  MGBENCH_REQUIRE(m.config == config_ && m.task == task_, DataError,
                  "checkpoint '{}' belongs to another configuration than its directory name says (edited by hand?)",
                  dir);
  MGBENCH_REQUIRE(m.world_size == env_.world_size(), ConfigError,
                  "checkpoint '{}' was written by {} rank(s); resume with the same number of ranks, not {}", dir,
                  m.world_size, env_.world_size());
  return m;
}

CheckpointState Checkpointer::load(const CheckpointManifest& manifest) const {
  return CheckpointState((fs::path(manifest.path) / rank_file_name(env_.rank())).string());
}

bool Checkpointer::save(const CheckpointManifest& manifest, const CheckpointState& state) {
  const fs::path final_dir = fs::path(directory_) / step_dir_name(manifest.global_step);
  const fs::path partial = fs::path(final_dir.string() + ".partial");
  const Stopwatch clock;
  if (!all_succeed(env_, "creating the checkpoint directory", [&] {
        if (env_.rank() != 0) return;
        fs::remove_all(partial);
        fs::create_directories(partial);
      })) {
    return false;
  }
  if (!all_succeed(env_, "writing the checkpoint",
                   [&] { state.write((partial / rank_file_name(env_.rank())).string()); })) {
    return false;
  }
  if (!all_succeed(env_, "committing the checkpoint", [&] {
        if (env_.rank() != 0) return;
        CheckpointManifest m = manifest;
        m.written_utc = utc_now_iso8601();
        write_text_file((partial / kManifestFile).string(), to_json(m).dump(2) + "\n");
        sync_to_disk(partial.string());
        fs::remove_all(final_dir);  // a checkpoint of the same step (a resumed run that stopped at once)
        fs::rename(partial, final_dir);
        sync_to_disk(directory_);
        // Keep the newest two complete checkpoints; drop older ones and abandoned .partial dirs.
        std::vector<std::pair<std::int64_t, fs::path>> complete;
        for (const auto& entry : fs::directory_iterator(directory_)) {
          const std::string name = entry.path().filename().string();
          const std::int64_t step = parse_step_dir(name);
          if (step >= 0) {
            complete.emplace_back(step, entry.path());
          } else if (name.size() > 8 && name.ends_with(".partial")) {
            fs::remove_all(entry.path());
          }
        }
        std::sort(complete.begin(), complete.end());
        for (std::size_t i = 0; i + 2 < complete.size(); ++i) fs::remove_all(complete[i].second);
      })) {
    return false;
  }
  log::info("checkpoint{}: global step {} -> {} ({:.2f} s)", manifest.completed ? " (run completed)" : "",
            manifest.global_step, final_dir.string(), clock.elapsed());
  return true;
}

// --- run progress ------------------------------------------------------------------------------

void RunProgress::save(CheckpointState& c) const {
  c.put("epoch", epoch);
  c.put("position", position);
  c.put("global_step", global_step);
  c.put("elapsed_s", elapsed_s);
  c.put("epoch_elapsed_s", epoch_elapsed_s);
  c.put("loss_sum", loss_sum);
  c.put("loss_steps", loss_steps);
  c.put_records<results::RunSummary>("records/summary", {&summary, 1});
  c.put_records<results::EpochRecord>("records/epoch", {&epoch_record, 1});
  c.put_records<results::StepRecord>("records/steps", steps);
}

void RunProgress::load(const CheckpointState& c) {
  epoch = c.integer("epoch");
  position = c.integer("position");
  global_step = c.integer("global_step");
  elapsed_s = c.number("elapsed_s");
  epoch_elapsed_s = c.number("epoch_elapsed_s");
  loss_sum = c.number("loss_sum");
  loss_steps = c.integer("loss_steps");
  const auto summaries = c.records<results::RunSummary>("records/summary");
  const auto epochs = c.records<results::EpochRecord>("records/epoch");
  MGBENCH_REQUIRE(summaries.size() == 1 && epochs.size() == 1 && epoch >= 0 && position >= 0 && global_step >= 0,
                  DataError, "checkpoint '{}': malformed run position", c.source());
  summary = summaries[0];
  epoch_record = epochs[0];
  steps = c.records<results::StepRecord>("records/steps");
}

void RunProgress::next_epoch() {
  position = 0;
  epoch_elapsed_s = 0;
  loss_sum = 0;
  loss_steps = 0;
  epoch_record = {};
  steps.clear();
}

void save_checkpoint(RunControl& control, const RunProgress& progress, bool completed,
                     const results::ResultsWriter& writer, const std::function<void(CheckpointState&)>& put_state) {
  if (control.checkpointer == nullptr || !control.checkpointer->enabled()) return;
  CheckpointState state;
  put_state(state);
  progress.save(state);
  CheckpointManifest m = control.checkpointer->manifest(progress.global_step, progress.epoch, completed);
  m.results = writer.path();
  m.run_id = writer.run_id();
  if (control.stop != nullptr && control.stop->agreed_signal() != 0) {
    m.stop_signal = runtime::stop_signal_name(control.stop->agreed_signal());
  }
  if (!control.checkpointer->save(m, state)) {
    log::warn("checkpoint at global step {} not written; the previous one stays the latest", progress.global_step);
  }
}

bool at_step_boundary(RunControl& control, RunProgress& progress, double run_elapsed_s, double epoch_clock_s,
                      const results::ResultsWriter& writer, const std::function<void(CheckpointState&)>& put_state) {
  const bool stop = control.stop != nullptr && control.stop->poll();
  if (stop || (control.checkpointer != nullptr && control.checkpointer->due(progress.global_step))) {
    const double epoch_elapsed_before = progress.epoch_elapsed_s;
    const Stopwatch checkpoint_clock;
    progress.elapsed_s = run_elapsed_s;
    progress.epoch_elapsed_s = epoch_elapsed_before + epoch_clock_s;
    save_checkpoint(control, progress, /*completed=*/false, writer, put_state);
    progress.epoch_elapsed_s = epoch_elapsed_before - checkpoint_clock.elapsed();
  }
  if (!stop) return false;
  control.preempted = true;
  const bool resumable = control.checkpointer != nullptr && control.checkpointer->enabled();
  log::info("stopped on {} after global step {} (epoch {}, step {}){}",
            runtime::stop_signal_name(control.stop->agreed_signal()), progress.global_step, progress.epoch + 1,
            progress.steps.size(),
            resumable ? fmt::format(": continue with --resume --checkpoint-dir {}", control.checkpointer->options().dir)
                      : std::string(": no --checkpoint-dir, nothing to resume from"));
  return true;
}

}  // namespace mgbench::train
