#include "train/job.h"

#include <unistd.h>

#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string_view>

#include <ATen/detail/CUDAHooksInterface.h>
#include <fmt/format.h>

#include "core/build_info.h"
#include "core/log.h"
#include "core/option_table.h"
#include "core/progress.h"
#include "core/timer.h"
#include "results/writer.h"
#include "runtime/agreement.h"
#include "runtime/mpi_communicator.h"
#include "runtime/nccl_communicator.h"
#include "runtime/stop_request.h"
#include "session/session.h"
#include "train/checkpoint/checkpointer.h"
#include "train/checkpoint/run_state.h"
#include "train/loop.h"

namespace mgbench::train {
namespace {

/// The checkpoint identity of this job (checkpointer.h): the settings that change results, and
/// what `--device auto` and `--backend auto` resolved to here (a run started on the CPU does not
/// continue on a GPU, nor the other way round).
std::string job_identity(const JobConfig& config, const session::Connection& c) {
  return config.identity() + fmt::format("device (resolved) = {}\nbackend (resolved) = {}\n",
                                         c.placement.is_cuda() ? "cuda" : "cpu", runtime::backend_name(c.backend));
}

/// A run being recorded, with its preemption and resume machinery. Does not move (control
/// points into it).
struct JobRun {
  std::unique_ptr<results::ResultsWriter> writer;
  std::unique_ptr<Checkpointer> checkpointer;
  std::unique_ptr<runtime::StopAgreement> stop;
  CheckpointState resume_state;
  RunControl control;
};

/// What a run is created with in the results file: its attributes, its ranks', its tables' sizes.
struct RunRecordShape {
  const h5::Attributes& run_attributes;
  h5::Attributes rank_attributes;
  results::RankLayout layout;
};

/// Starts recording the run, as agreed stages: continues `from` (a checkpoint of this
/// configuration, found before the set-up) in its own results file, or creates a new run of
/// `shape`. nullptr when a stage failed (logged once; every rank returns).
std::unique_ptr<JobRun> start_run(runtime::MpiEnvironment& env, const TrainOptions& train,
                                  std::unique_ptr<Checkpointer> checkpointer,
                                  const std::optional<CheckpointManifest>& from, const RunRecordShape& shape) {
  const results::RankLayout& layout = shape.layout;
  auto job = std::make_unique<JobRun>();
  job->checkpointer = std::move(checkpointer);
  if (from) {
    if (!runtime::all_succeed(env, "reading the checkpoint",
                              [&] { job->resume_state = job->checkpointer->load(*from); })) {
      return nullptr;
    }
    std::error_code ec;
    if (!std::filesystem::equivalent(from->results, train.results, ec)) {
      log::info("--resume: the run continues in its own results file {} (not --results {})", from->results,
                train.results);
    }
    job->control.resume = &job->resume_state;
    job->control.resume_world_size = static_cast<int>(from->world_size);
    if (from->world_size == env.world_size()) {
      if (!runtime::all_succeed(env, "reopening the results file", [&] {
            job->writer = std::make_unique<results::ResultsWriter>(from->results, env.world(), from->run_id, layout);
          })) {
        return nullptr;
      }
      log::info("results: {} run {} resumed from {} (global step {})", from->results, from->run_id, from->path,
                from->global_step);
    } else {
      // Another number of ranks: a run of its own (a run's tables are per rank), linked to the one it continues.
      h5::Attributes attributes = shape.run_attributes;
      h5::merge_attributes(attributes, {{"continues_run", from->run_id},
                                        {"continues_global_step", from->global_step},
                                        {"continues_world_size", from->world_size}});
      job->writer = session::open_run(env, from->results, train.run_name, attributes, shape.rank_attributes, layout);
      if (!job->writer) return nullptr;
      log::info("results: {} run {} continues run {} of {} rank(s) from {} (global step {})", from->results,
                job->writer->run_id(), from->run_id, from->world_size, from->path, from->global_step);
    }
  } else {
    job->writer =
        session::open_run(env, train.results, train.run_name, shape.run_attributes, shape.rank_attributes, layout);
    if (!job->writer) return nullptr;
  }
  job->stop = std::make_unique<runtime::StopAgreement>(env.world());
  job->control.checkpointer = job->checkpointer.get();
  job->control.stop = job->stop.get();
  return job;
}

std::string done_line(const results::RunSummary& s, const char* unit) {
  std::string line =
      fmt::format("done: {} epoch(s) in {:.1f} s | loss {:.4f}", s.epochs_completed, s.total_s, s.final_loss);
  if (std::isfinite(s.test_accuracy)) line += fmt::format(" | test accuracy {:.2f} %", 100 * s.test_accuracy);
  if (std::isfinite(s.eval_loss)) line += fmt::format(" | eval loss {:.4f}", s.eval_loss);
  if (!std::isfinite(s.s_per_it)) {
    line += " | no step timed after the warm-up";
  } else {
    line += std::isfinite(s.tokens_per_s) ? fmt::format(" | {:.0f} tokens/s", s.tokens_per_s)
                                          : fmt::format(" | {:.1f} {}", s.samples_per_s, unit);
    line += fmt::format(" (all ranks) | {:.3f} s/it", s.s_per_it);
  }
  if (std::isfinite(s.mfu)) line += fmt::format(" | MFU {:.1f} %", 100 * s.mfu);
  line += fmt::format(" | peak memory {:.0f} MiB", static_cast<double>(s.peak_memory_bytes) / (1024.0 * 1024.0));
  return line;
}

}  // namespace

namespace {

/// What one run of a job shares with the job's others.
struct JobContext {
  JobConfig& config;
  runtime::MpiEnvironment& env;
  session::Connection& connection;
  const std::string& task;
  const std::string& identity;
  const std::string& command_line;
};

/// Whether every rank has the same `value` of `what`: ranks launched with other options (an MPMD
/// launch, a script that differs per node) or that see other data (node-local copies that differ)
/// would run other collectives -- MPI_ERR_TRUNCATE, a hang, a corrupted heap. Collective; rank 0
/// says what differs.
bool same_on_every_rank(const runtime::MpiEnvironment& env, double value, std::string_view what) {
  const runtime::MpiEnvironment::Spread s = env.spread(value);
  if (s.min == s.max) return true;
  if (env.rank() == 0) {
    log::error(
        "the ranks differ in {} (from {:.0f} to {:.0f}): every rank must be started with the same options and see "
        "the same data (one file system, or identical copies)",
        what, s.min, s.max);
  }
  return false;
}

/// One run of the job: set-up, the run in the results file, training (or evaluation), its last line.
/// Returns the exit code (kExitPreempted: stopped at a checkpoint).
int run_once(const JobContext& c, std::unique_ptr<Checkpointer> checkpointer,
             const std::optional<CheckpointManifest>& from, std::int64_t repeat_index) {
  JobConfig& config = c.config;
  runtime::MpiEnvironment& env = c.env;
  const bool eval_only = config.recipe->eval_only();
  std::unique_ptr<TrainingLoop> loop;
  if (!same_on_every_rank(env, static_cast<double>(std::stoul(options::config_id(c.identity), nullptr, 16)),
                          "their options (the workload identity's checksum, config_id)")) {
    return 2;
  }
  if (!runtime::all_succeed(env, "set-up", [&] {
        loop = std::make_unique<TrainingLoop>(config.train, *config.recipe, *c.connection.comm, c.connection.placement,
                                              NodeShare{env.local_size(), c.connection.host_memory});
      })) {
    return 1;
  }
  if (!same_on_every_rank(env, static_cast<double>(config.recipe->train_size()), "their training samples") ||
      !same_on_every_rank(env, static_cast<double>(config.recipe->eval_size()), "their evaluation samples")) {
    return 1;
  }
  if (from && !runtime::all_succeed(env, "checking the resume", [&] { loop->check_resume(*from); })) return 1;
  h5::Attributes attributes = session::common_attributes(env, config.table, c.task, c.identity, c.command_line);
  h5::merge_attributes(attributes, loop->run_attributes());
  TrainOptions train = config.train;
  if (train.repeat > 1) {
    attributes.emplace_back("repeat_index", repeat_index);
    train.run_name = fmt::format("{}{}r{}", train.run_name, train.run_name.empty() ? "" : "-", repeat_index);
  }
  runtime::defer_stops_to_step_boundaries();
  const auto job =
      start_run(env, train, std::move(checkpointer), from, {attributes, loop->rank_attributes(), loop->layout()});
  if (!job) return 1;
  results::ResultsWriter& writer = *job->writer;
  Progress progress(env.rank() == 0, loop->throughput_unit(), config.train.progress_interval_s);
  results::RunSummary summary;
  session::run_or_abort(
      env, writer, eval_only ? "evaluation" : "training",
      [&] {
        summary = loop->run(writer, progress, job->control);
        if (!job->control.preempted) loop->finish(env.rank());
      },
      &job->control.preempted, &job->control.not_resumable);
  if (!job->control.not_resumable.empty()) return 1;  // stopped, and its checkpoint lost: not a preemption
  if (job->control.preempted) return kExitPreempted;
  if (eval_only) {
    if (env.rank() == 0) std::cout << fmt::format("eval loss: {:.6f}\n", summary.eval_loss) << std::flush;
    return 0;
  }
  log::info("{} | {} run {}", done_line(summary, loop->throughput_unit()), writer.path(), writer.run_id());
  return 0;
}

}  // namespace

int run_job(JobConfig& config, runtime::MpiEnvironment& env, const std::string& command_line) {
  // A stop during set-up ends the process at once (exit 75: nothing trained, nothing written); from
  // the moment the run is created in the results file, at the next step boundary (a checkpoint
  // and exit 75, which the batch scripts requeue).
  runtime::install_stop_handlers();
  runtime::name_process_for_stop_message(fmt::format("rank {} on {}", env.rank(), env.hostname()));
  session::Connection connection =
      session::connect(env, config.train.device, config.train.backend, config.train.comm_timeout_s);
  if (!connection.comm) return 1;
  const std::string task = config.recipe->eval_only() ? config.task + "-eval" : config.task;
  const std::string identity = job_identity(config, connection);

  // Where the run starts, before the set-up (which may load gigabytes): a refused resume or an
  // already completed run costs nothing.
  std::unique_ptr<Checkpointer> checkpointer;
  std::optional<CheckpointManifest> from;
  const bool any_world_size = config.train.global_batch_size > 0;  // its steps the same at any world size
  if (!runtime::all_succeed(env, "setting up checkpoints", [&] {
        checkpointer = std::make_unique<Checkpointer>(config.train.checkpoint, env, task, identity, any_world_size);
        from = checkpointer->find_start();
      })) {
    return 1;
  }
  if (from && from->completed) {
    log::info("--resume: run {} in {} already completed (checkpoint {}): nothing to do", from->run_id, from->results,
              from->path);
    return 0;
  }
  if (config.train.checkpoint.resume && !from) {
    log::info("--resume: no checkpoint of this configuration in {}: starting a new run", config.train.checkpoint.dir);
  }
  const JobContext context{config, env, connection, task, identity, command_line};
  // --repeat N: N runs, each set up afresh (the same seed: the same model, data order and schedule);
  // validate() keeps checkpoints to single runs.
  for (std::int64_t i = 0; i < config.train.repeat; ++i) {
    if (i > 0) {
      checkpointer = std::make_unique<Checkpointer>(config.train.checkpoint, env, task, identity, any_world_size);
    }
    const int exit_code = run_once(context, std::move(checkpointer), i == 0 ? from : std::nullopt, i);
    if (exit_code != 0) return exit_code;
  }
  return 0;
}

}  // namespace mgbench::train
