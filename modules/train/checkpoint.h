#pragma once
// Checkpoints for preemption and resume (`--checkpoint-dir`, `--checkpoint-every`, `--resume`).
//
// Layout, one directory per run configuration so that `--resume` never continues a different
// experiment:
//   <checkpoint-dir>/<task>-<config id>/step-<global step, 9 digits>/
//       checkpoint.json           manifest (rank 0): step, epoch, world size, results file, run id,
//                                 the configuration text, whether the run had completed
//       rank-<r>.safetensors      each rank's state: model parameters and buffers ("model/<name>"),
//                                 optimizer state (LibTorch's own serialisation, as bytes), RNG
//                                 states, the partial epoch's records; scalars in the metadata
// <config id> is the CRC-32 of the configuration text (the job's run attributes; not the world
// size, so that a resume with another number of ranks finds the checkpoint and is refused).
//
// Atomicity: ranks write into step-<N>.partial/ (each file written, fsynced, renamed); only when
// every rank succeeded does rank 0 write the manifest and rename the directory to step-<N>. A job
// killed at any moment thus leaves either the previous checkpoint or the new one, never a torn
// one; leftover .partial directories are ignored and removed by the next successful save. The
// newest two complete checkpoints are kept.
//
// The files are safetensors (github huggingface/safetensors), readable with its Python package.
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/torch.h>

#include "results/schema.h"
#include "results/writer.h"
#include "runtime/mpi_env.h"
#include "runtime/stop_request.h"
#include "train/checkpoint_options.h"

namespace mgbench::models {
class SafetensorsFile;
}

namespace mgbench::train {

/// The run-level facts of a checkpoint (checkpoint.json), identical on every rank.
struct CheckpointManifest {
  std::string path;  // the step-<N> directory (filled by Checkpointer::latest)
  std::string task;
  std::string config_id;
  std::string config;
  std::int64_t world_size = 0;
  std::int64_t global_step = 0;  // optimizer steps completed
  std::int64_t epoch = 0;        // the epoch in progress (== epochs when completed)
  bool completed = false;        // the run had finished: nothing left to resume
  std::string results;           // the results file and run the checkpoint belongs to
  std::string run_id;
  std::string stop_signal;  // "SIGUSR1", "SIGTERM" or "" (periodic / final checkpoint)
  std::string written_utc;
};

/// One rank's state: named tensors plus string metadata. Writers put, readers get; a missing
/// entry on reading is a DataError naming the file and the entry.
class CheckpointState {
 public:
  CheckpointState();
  /// A state read from file (mapped; tensors are CPU views until copied).
  explicit CheckpointState(const std::string& path);
  ~CheckpointState();
  CheckpointState(CheckpointState&&) noexcept;
  CheckpointState& operator=(CheckpointState&&) noexcept;

  void put(const std::string& name, const torch::Tensor& tensor);
  void put(const std::string& key, std::int64_t value);
  void put(const std::string& key, double value);
  void put_text(const std::string& key, const std::string& value);
  /// Trivially copyable records (results rows) as bytes; restored only by the same build.
  template <typename T>
  void put_records(const std::string& name, std::span<const T> records) {
    static_assert(std::is_trivially_copyable_v<T>);
    put_bytes(name, records.data(), records.size_bytes(), sizeof(T));
  }

  bool contains(const std::string& name) const;
  torch::Tensor tensor(const std::string& name) const;
  std::int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  std::string text(const std::string& key) const;
  template <typename T>
  std::vector<T> records(const std::string& name) const {
    static_assert(std::is_trivially_copyable_v<T>);
    const torch::Tensor bytes = record_bytes(name, sizeof(T));
    std::vector<T> out(static_cast<std::size_t>(bytes.numel()) / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), bytes.data_ptr(), bytes.numel());
    return out;
  }

  /// Writes the state to path atomically (safetensors, fsynced). Throws DataError naming the file.
  void write(const std::string& path) const;
  const std::string& source() const { return source_; }

 private:
  void put_bytes(const std::string& name, const void* data, std::size_t bytes, std::size_t record_size);
  torch::Tensor record_bytes(const std::string& name, std::size_t record_size) const;
  const std::string& meta(const std::string& key) const;

  std::string source_;  // file read from ("" for a state being written)
  std::vector<std::pair<std::string, torch::Tensor>> tensors_;
  std::map<std::string, std::string> metadata_;
  std::unique_ptr<models::SafetensorsFile> file_;
};

/// Parameters and buffers of module as "<prefix><name>" (copied to the CPU).
void put_module(CheckpointState& state, const std::string& prefix, torch::nn::Module& module);
/// Copies them back in place (device and dtype of the module kept). Throws DataError naming the
/// file for a missing tensor or a shape mismatch.
void load_module(const CheckpointState& state, const std::string& prefix, torch::nn::Module& module);
/// The named tensors given (e.g. LoRA adapters only), by name.
void put_tensors(CheckpointState& state, const std::string& prefix,
                 const std::vector<std::pair<std::string, torch::Tensor>>& tensors);
void load_tensors(const CheckpointState& state, const std::string& prefix,
                  const std::vector<std::pair<std::string, torch::Tensor>>& tensors);
/// The optimizer's state (torch::optim's own archive format, stored as bytes).
void put_optimizer(CheckpointState& state, const std::string& name, torch::optim::Optimizer& optimizer);
void load_optimizer(const CheckpointState& state, const std::string& name, torch::optim::Optimizer& optimizer);
/// The default CPU generator's state and, for a CUDA device, that device's generator.
void put_rng(CheckpointState& state, const torch::Device& device);
void load_rng(const CheckpointState& state, const torch::Device& device);

/// CRC-32 of the configuration text as 8 hex digits.
std::string config_id(const std::string& config_text);

class Checkpointer {
 public:
  /// config_text identifies the run configuration (same text, same directory). Collective-free.
  Checkpointer(CheckpointOptions options, runtime::MpiEnvironment& env, std::string task, std::string config_text);

  bool enabled() const { return !options_.dir.empty(); }
  const CheckpointOptions& options() const { return options_; }
  /// A periodic checkpoint is due after global_step optimizer steps.
  bool due(std::int64_t global_step) const {
    return enabled() && options_.every_steps > 0 && global_step > 0 && global_step % options_.every_steps == 0;
  }
  /// <dir>/<task>-<config id>.
  const std::string& directory() const { return directory_; }

  /// Collective. The newest complete checkpoint of this configuration (rank 0 scans, every rank
  /// gets the same answer); nullopt when there is none. Throws DataError (on every rank) for an
  /// unreadable manifest, ConfigError when it was written by a different number of ranks.
  std::optional<CheckpointManifest> latest();
  /// This rank's state of a checkpoint. Throws DataError naming the file.
  CheckpointState load(const CheckpointManifest& manifest) const;
  /// Collective: writes every rank's state and commits the checkpoint (see the file comment).
  /// Returns false, on every rank, when some rank could not write (that rank logs why; the
  /// previous checkpoint stays the latest). manifest.path is ignored.
  bool save(const CheckpointManifest& manifest, const CheckpointState& state);
  /// A manifest for this configuration with the given position (task, config, world size filled).
  CheckpointManifest manifest(std::int64_t global_step, std::int64_t epoch, bool completed) const;

 private:
  CheckpointOptions options_;
  runtime::MpiEnvironment& env_;
  std::string task_;
  std::string config_;
  std::string config_id_;
  std::string directory_;
};

/// What a job hands its trainer for preemption and resume. Every pointer may be null.
struct RunControl {
  Checkpointer* checkpointer = nullptr;     // periodic and final checkpoints, and the one at a stop
  runtime::StopAgreement* stop = nullptr;   // polled at every step boundary
  const CheckpointState* resume = nullptr;  // the state to continue from
  bool preempted = false;                   // out: the run stopped early on a signal
};

/// Where a run stands at a step boundary, as both trainers keep it: what a checkpoint carries
/// besides the model and optimizer so that a resumed run continues as if never stopped. Trainers
/// add their own counters to the same CheckpointState.
struct RunProgress {
  std::int64_t epoch = 0;                  // the epoch in progress (0-based; == epochs when done)
  std::int64_t position = 0;               // within it: plan entries taken (image) / optimizer steps done (llm)
  std::int64_t global_step = 0;            // optimizer steps done over the run
  double elapsed_s = 0;                    // run time so far [s], excluding time away while preempted
  double epoch_elapsed_s = 0;              // time in the epoch in progress before this process took it over [s]
  double loss_sum = 0;                     // the epoch's finite step losses
  std::int64_t loss_steps = 0;             // and their number
  results::RunSummary summary;             // accumulated: train_s, eval_s, test_accuracy, final_loss, epochs_completed
  results::EpochRecord epoch_record;       // the epoch in progress
  std::vector<results::StepRecord> steps;  // the epoch's steps so far

  void save(CheckpointState& state) const;
  /// Throws DataError naming the file for missing or malformed entries.
  void load(const CheckpointState& state);
  /// Clears the per-epoch part for the next epoch.
  void next_epoch();
};

/// Writes a checkpoint of `progress` plus what `put_state` adds (model, optimizer, RNG, the
/// trainer's counters) when control has a checkpointer; records the writer's results file and run
/// and the agreed stop signal in the manifest. Collective. A failed save is logged and training
/// goes on (the previous checkpoint stays the latest).
void save_checkpoint(RunControl& control, const RunProgress& progress, bool completed,
                     const results::ResultsWriter& writer, const std::function<void(CheckpointState&)>& put_state);

/// The step boundary, after each optimizer step on every rank: polls the agreed stop and writes a
/// checkpoint when one is due (--checkpoint-every) or the run stops. progress.elapsed_s and
/// epoch_elapsed_s are updated for the checkpoint; writing it is not counted as training time
/// (epoch_elapsed_s is lowered by its duration). epoch_clock_s: time since this process began the
/// epoch. Returns true when the job agreed to stop (control.preempted is then set and the stop is
/// logged).
bool at_step_boundary(RunControl& control, RunProgress& progress, double run_elapsed_s, double epoch_clock_s,
                      const results::ResultsWriter& writer, const std::function<void(CheckpointState&)>& put_state);

}  // namespace mgbench::train
