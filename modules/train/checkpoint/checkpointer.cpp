#include "train/checkpoint/checkpointer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/agreement.h"
#include "core/build_info.h"
#include "core/durable.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/log.h"
#include "core/mpi_strings.h"
#include "core/option_table.h"
#include "core/timer.h"
#include "models/json_file.h"
#include "runtime/agreement.h"
#include "train/checkpoint/reshard.h"

namespace mgbench::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kManifestFile = "checkpoint.json";
constexpr const char* kFormat = "mgbench-checkpoint";
// 2: `config` is the identity text (the settings that change results); 3: the optimizer's state
// named per parameter, shards stored with their whole shape (reshard.h).
constexpr int kFormatVersion = 3;

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
          {"position", m.position},
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
    const std::int64_t version = j.contains("format_version") ? models::json_integer(j["format_version"]) : 0;
    MGBENCH_REQUIRE(j.value("format", "") == kFormat && version == kFormatVersion, DataError,
                    "checkpoint manifest '{}': not an mgbench checkpoint of format version {}", file, kFormatVersion);
    m.task = j.at("task").get<std::string>();
    m.config_id = j.at("config_id").get<std::string>();
    m.config = j.at("config").get<std::string>();
    m.world_size = models::json_integer(j.at("world_size"));
    MGBENCH_REQUIRE(m.world_size >= 1, DataError, "checkpoint manifest '{}': world_size {} is not a number of ranks",
                    file, m.world_size);
    m.global_step = models::json_integer(j.at("global_step"));
    m.epoch = models::json_integer(j.at("epoch"));
    m.position = models::json_integer(j.at("position"));
    MGBENCH_REQUIRE(m.position >= 0, DataError, "checkpoint manifest '{}': position {} is not a number of batches",
                    file, m.position);
    MGBENCH_REQUIRE(m.global_step >= 0 && m.epoch >= 0, DataError,
                    "checkpoint manifest '{}': global_step {} and epoch {}: expected counts (>= 0)", file,
                    m.global_step, m.epoch);
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
  require_regular_file(path, "checkpoint file");
  std::ifstream in(path, std::ios::binary);
  MGBENCH_REQUIRE(in.good(), DataError, "checkpoint: cannot read '{}' ({})", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// The newest complete checkpoint (step directory with a manifest) under config_dir; empty when none.
fs::path newest_step_dir(const fs::path& config_dir) {
  std::int64_t best = -1;
  fs::path best_dir;
  std::error_code ec;
  if (!fs::is_directory(config_dir, ec)) return best_dir;
  for (const auto& entry : fs::directory_iterator(config_dir)) {
    const std::int64_t step = parse_step_dir(entry.path().filename().string());
    if (step > best && fs::exists(entry.path() / kManifestFile)) {
      best = step;
      best_dir = entry.path();
    }
  }
  return best_dir;
}

}  // namespace

// --- Checkpointer -------------------------------------------------------------------------------

Checkpointer::Checkpointer(CheckpointOptions options, const runtime::MpiEnvironment& env, std::string task,
                           std::string identity, bool any_world_size)
    : options_(std::move(options)),
      env_(env),
      task_(std::move(task)),
      config_(std::move(identity)),
      any_world_size_(any_world_size) {
  options_.validate();
  config_id_ = options::config_id(config_);
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
  std::optional<CheckpointManifest> m = scan();
  if (m) {
    MGBENCH_REQUIRE(m->world_size == env_.world_size() || any_world_size_, ConfigError,
                    "checkpoint '{}' was written by {} rank(s); resume with the same number of ranks, not {} (a run "
                    "started with --global-batch-size, its steps the same at any number of ranks, may resume at "
                    "another)",
                    m->path, m->world_size, env_.world_size());
  }
  return m;
}

std::optional<CheckpointManifest> Checkpointer::scan() {
  // Rank 0 answers with "" (none), "M" + manifest JSON + '\n' + path, or "E" + error.
  std::string answer;
  if (env_.rank() == 0 && enabled()) {
    try {
      const fs::path best_dir = newest_step_dir(directory_);
      if (!best_dir.empty())
        answer = "M" + read_text_file((best_dir / kManifestFile).string()) + '\n' + best_dir.string();
    } catch (const std::exception& e) {
      answer = std::string("E") + error_message(e);
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
  // The step the directory is named by (and found as the newest by) is the one the manifest means.
  const std::int64_t named = parse_step_dir(fs::path(dir).filename().string());
  MGBENCH_REQUIRE(m.global_step == named, DataError,
                  "checkpoint '{}': its manifest says global step {}, its directory name {} (edited by hand?)", dir,
                  m.global_step, named);
  return m;
}

std::optional<CheckpointManifest> Checkpointer::find_start() {
  if (!enabled()) return std::nullopt;
  if (!options_.resume) {
    const std::optional<CheckpointManifest> earlier = scan();
    MGBENCH_REQUIRE(!earlier, ConfigError,
                    "--checkpoint-dir {}: {} already holds checkpoints of this configuration (run {} in {}, global "
                    "step {}{}). Add --resume to continue that run, or start a new one with another --checkpoint-dir "
                    "(or after removing {})",
                    options_.dir, directory_, earlier->run_id, earlier->results, earlier->global_step,
                    earlier->completed ? ", completed" : "", directory_);
    prepare_directory();
    return std::nullopt;
  }
  std::optional<CheckpointManifest> mine = latest();
  if (mine) {
    if (!mine->completed) prepare_directory();  // a completed run has nothing left to write (every rank alike)
    return mine;
  }
  std::string other;
  if (env_.rank() == 0) {
    try {
      other = other_configuration();
    } catch (const std::exception& e) {
      other = fmt::format("--resume: cannot read {}: {}", options_.dir, error_message(e));
    }
  }
  other = broadcast_string(env_.world(), other);
  MGBENCH_REQUIRE(other.empty(), ConfigError, "{}", other);
  prepare_directory();
  return std::nullopt;
}

void Checkpointer::prepare_directory() const {
  const Agreement made = agree(env_.world(), "preparing --checkpoint-dir", [&] {
    const std::string problem = make_writable_directory(directory_);
    MGBENCH_REQUIRE(problem.empty(), ConfigError,
                    "--checkpoint-dir '{}': {}: {}: the run could neither checkpoint nor be resumed", options_.dir,
                    directory_, problem);
  });
  MGBENCH_REQUIRE(made.ok(), ConfigError, "{}", made.error);
}

std::string Checkpointer::other_configuration() const {
  // The newest complete checkpoint of another configuration of this task, by the time it was written.
  const std::string prefix = task_ + "-";
  std::optional<CheckpointManifest> newest;
  std::string unreadable;
  std::error_code ec;
  if (!fs::is_directory(options_.dir, ec)) return "";
  for (const auto& entry : fs::directory_iterator(options_.dir)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind(prefix, 0) != 0 || name.size() != prefix.size() + 8 ||
        entry.path() == fs::path(directory_)) {
      continue;
    }
    const fs::path step_dir = newest_step_dir(entry.path());
    if (step_dir.empty()) continue;
    const std::string file = (step_dir / kManifestFile).string();
    try {
      CheckpointManifest m = manifest_from_json(read_text_file(file), file);
      m.path = step_dir.string();
      if (!newest || m.written_utc > newest->written_utc) newest = std::move(m);
    } catch (const DataError& e) {
      unreadable = e.what();
    }
  }
  if (!newest && unreadable.empty()) return "";
  std::string what;
  if (newest) {
    std::string differ;
    for (const auto& d : options::differences(newest->config, config_)) differ += "\n  " + d;
    what = fmt::format(
        "its newest checkpoint, {} (run {} in {}, global step {}), is of another configuration; the settings "
        "that differ (checkpoint -> this command):{}",
        newest->path, newest->run_id, newest->results, newest->global_step, differ);
  } else {
    what = fmt::format("it holds checkpoints of another configuration ({})", unreadable);
  }
  return fmt::format(
      "--resume: {} holds no checkpoint of this configuration: {}\nTo continue that run, give its settings; "
      "to start a new run, leave out --resume or use another --checkpoint-dir",
      options_.dir, what);
}

CheckpointState Checkpointer::load(const CheckpointManifest& manifest) const {
  if (manifest.world_size != env_.world_size()) {
    std::vector<std::string> files;
    for (int r = 0; r < manifest.world_size; ++r) {
      files.push_back((fs::path(manifest.path) / rank_file_name(r)).string());
    }
    return reshard_checkpoint(files, env_.rank(), env_.world_size());
  }
  CheckpointState state((fs::path(manifest.path) / rank_file_name(env_.rank())).string());
  state.check_rank(env_.rank());
  return state;
}

bool Checkpointer::save(const CheckpointManifest& manifest, const CheckpointState& state) {
  const fs::path final_dir = fs::path(directory_) / step_dir_name(manifest.global_step);
  const fs::path partial = fs::path(final_dir.string() + ".partial");
  const Stopwatch clock;
  if (!runtime::all_succeed(env_, "creating the checkpoint directory", [&] {
        if (env_.rank() != 0) return;
        remove_tree(partial.string());
        fs::create_directories(partial);
      })) {
    return false;
  }
  if (!runtime::all_succeed(env_, "writing the checkpoint",
                            [&] { state.write((partial / rank_file_name(env_.rank())).string(), env_.rank()); })) {
    return false;
  }
  if (!runtime::all_succeed(env_, "committing the checkpoint", [&] {
        if (env_.rank() != 0) return;
        CheckpointManifest m = manifest;
        m.written_utc = utc_now_iso8601();
        write_text_file((partial / kManifestFile).string(), to_json(m).dump(2) + "\n");
        sync_to_disk(partial.string());
        remove_tree(final_dir.string());  // a checkpoint of the same step (a resumed run that stopped at once)
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
            remove_tree(entry.path().string());
          }
        }
        std::sort(complete.begin(), complete.end());
        for (std::size_t i = 0; i + 2 < complete.size(); ++i) remove_tree(complete[i].second.string());
      })) {
    return false;
  }
  log::info("checkpoint{}: global step {} -> {} ({:.2f} s)", manifest.completed ? " (run completed)" : "",
            manifest.global_step, final_dir.string(), clock.elapsed());
  return true;
}

}  // namespace mgbench::train
