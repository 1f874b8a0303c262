#pragma once
// The checkpoint directory protocol (--checkpoint-dir, --checkpoint-every, --resume).
//
// Layout, one directory per run configuration:
//   <checkpoint-dir>/<task>-<config id>/step-<global step, 9 digits>/
//       checkpoint.json           manifest (rank 0): step, epoch, world size, results file, run id,
//                                 the configuration's identity text, whether the run had completed
//       rank-<r>.safetensors      each rank's state (checkpoint_state.h)
// The identity text is the job's settings that change results, as "name = value" lines
// (options::OptionTable::identity: every option but the documented few that do not, such as
// --results, --progress-interval, --checkpoint-every and the profiling switches); <config id> is
// its CRC-32. Not the world size: a run given --global-batch-size (its steps the same at any
// world size) resumes at another number of ranks, each rank's state put together from the rank
// files (reshard.h); without it, a resume with another number of ranks is refused with a message.
//
// A run continues only the run of its own configuration: --resume with a setting that changes
// results different from the checkpoint's is refused, naming the settings; a new run is refused
// where checkpoints of an earlier run of its configuration would mix with its own.
//
// Atomicity: ranks write into step-<N>.partial/ (each file written, fsynced, renamed); only when
// every rank succeeded does rank 0 write the manifest and rename the directory to step-<N>. A job
// killed at any moment thus leaves either the previous checkpoint or the new one, never a torn
// one; leftover .partial directories are ignored and removed by the next successful save. The
// newest two complete checkpoints are kept.
#include <cstdint>
#include <optional>
#include <string>

#include "runtime/mpi_env.h"
#include "train/checkpoint/checkpoint_options.h"
#include "train/checkpoint/checkpoint_state.h"

namespace mgbench::train {

/// The run-level facts of a checkpoint (checkpoint.json), identical on every rank.
struct CheckpointManifest {
  std::string path;  // the step-<N> directory (filled when read)
  std::string task;
  std::string config_id;
  std::string config;  // the identity text
  std::int64_t world_size = 0;
  std::int64_t global_step = 0;  // optimizer steps completed
  std::int64_t epoch = 0;        // the epoch in progress (== epochs when completed)
  std::int64_t position = 0;     // micro-batches each rank took of that epoch's plan (0: at its start)
  bool completed = false;        // the run had finished: nothing left to resume
  std::string results;           // the results file and run the checkpoint belongs to
  std::string run_id;
  std::string stop_signal;  // "SIGUSR1", "SIGTERM" or "" (periodic / final checkpoint)
  std::string written_utc;
};

class Checkpointer {
 public:
  /// identity: the text of the settings that change results (see above); any_world_size: a
  /// checkpoint of this configuration may be resumed at another number of ranks (the run's global
  /// batch is fixed). Collective-free. Throws ConfigError for inconsistent options
  /// (CheckpointOptions::validate).
  Checkpointer(CheckpointOptions options, const runtime::MpiEnvironment& env, std::string task, std::string identity,
               bool any_world_size = false);

  bool enabled() const { return !options_.dir.empty(); }
  const CheckpointOptions& options() const { return options_; }
  /// A periodic checkpoint is due after global_step optimizer steps.
  bool due(std::int64_t global_step) const {
    return enabled() && options_.every_steps > 0 && global_step > 0 && global_step % options_.every_steps == 0;
  }
  /// <dir>/<task>-<config id>.
  const std::string& directory() const { return directory_; }

  /// Collective. Where this job starts: with --resume, the newest complete checkpoint of this
  /// configuration (nullopt: there is none, a new run starts). Throws, on every rank:
  ///  - ConfigError when --resume finds no checkpoint of this configuration but one of another in
  ///    --checkpoint-dir: the message names the settings that differ from the newest such
  ///    checkpoint's and how to start afresh;
  ///  - ConfigError when a new run (no --resume) would write into a directory holding checkpoints
  ///    of an earlier run of this configuration (a later --resume could not tell them apart);
  ///  - ConfigError when the checkpoint was written by another number of ranks, unless
  ///    any_world_size;
  ///  - DataError for an unreadable manifest of this configuration;
  ///  - ConfigError when directory() cannot be made or written (prepare_directory).
  std::optional<CheckpointManifest> find_start();
  /// Collective. The newest complete checkpoint of this configuration (rank 0 scans, every rank
  /// gets the same answer); nullopt when there is none. Throws DataError (on every rank) for an
  /// unreadable manifest, ConfigError when it was written by a different number of ranks (unless
  /// any_world_size), naming --global-batch-size.
  std::optional<CheckpointManifest> latest();
  /// This rank's state of a checkpoint: its rank file, or, written by another number of ranks, its
  /// state put together from theirs (reshard_checkpoint). Throws DataError naming the file.
  CheckpointState load(const CheckpointManifest& manifest) const;
  /// Collective: writes every rank's state and commits the checkpoint (see the file comment).
  /// Returns false, on every rank, when some rank could not write (that rank logs why; the
  /// previous checkpoint stays the latest). manifest.path is ignored.
  bool save(const CheckpointManifest& manifest, const CheckpointState& state);
  /// A manifest for this configuration with the given position (task, config, world size filled).
  CheckpointManifest manifest(std::int64_t global_step, std::int64_t epoch, bool completed) const;

 private:
  /// Collective. The newest complete checkpoint of this configuration, unchecked.
  std::optional<CheckpointManifest> scan();
  /// Rank 0: the newest complete checkpoint of another configuration of this task in the
  /// checkpoint directory, as the refusal message's text; "" when there is none.
  std::string other_configuration() const;
  /// Collective: makes directory() on every rank (a shared file system's one path, or each node's
  /// own) and checks it is writable, at set-up rather than at the first checkpoint. Throws
  /// ConfigError on every rank, naming --checkpoint-dir and the system's reason.
  void prepare_directory() const;

  CheckpointOptions options_;
  const runtime::MpiEnvironment& env_;
  std::string task_;
  std::string config_;
  std::string config_id_;
  std::string directory_;
  bool any_world_size_ = false;
};

}  // namespace mgbench::train
