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

#include <ATen/detail/CUDAHooksInterface.h>
#include <fmt/format.h>

#include "core/build_info.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/timer.h"
#include "results/writer.h"
#include "runtime/agreement.h"
#include "runtime/mpi_communicator.h"
#include "runtime/nccl_communicator.h"
#include "runtime/stop_request.h"
#include "train/checkpointer.h"
#include "train/loop.h"
#include "train/run_state.h"

namespace mgbench::train {
namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

/// The cuDNN library LibTorch loaded (cudnnGetVersion: 91000 -> "9.10.0"); "" without CUDA.
std::string cudnn_version() {
  try {
    const long v = at::detail::getCUDAHooks().versionRuntimeCuDNN();
    return v > 0 ? fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100) : "";
  } catch (const std::exception&) {
    return "";
  }
}

/// Attributes in `more` replace those of the same name in `into`; the others are appended.
void merge(h5::Attributes& into, h5::Attributes more) {
  for (auto& [name, value] : more) {
    auto it = std::find_if(into.begin(), into.end(), [&](const auto& a) { return a.first == name; });
    if (it != into.end()) {
      it->second = std::move(value);
    } else {
      into.emplace_back(std::move(name), std::move(value));
    }
  }
}

struct Connection {
  runtime::DevicePlacement placement;
  runtime::Backend backend = runtime::Backend::kMpi;  // resolved: kNccl or kMpi
  std::unique_ptr<runtime::Communicator> comm;        // nullptr: a stage failed (logged)
};

/// Places this rank (--device), checks GPU sharing over the node, resolves --backend and creates
/// the communicator, each stage agreed over all ranks.
Connection connect(runtime::MpiEnvironment& env, const TrainOptions& train) {
  Connection c;
  runtime::Backend& backend = c.backend;
  // Every rank picks its GPU by local rank, then the node checks that no two ranks share one
  // (NCCL's rule) from the GPUs' PCI bus ids.
  if (!runtime::all_succeed(env, "device placement", [&] {
        c.placement = runtime::place_rank(train.device, runtime::visible_cuda_devices(), env.local_rank());
        backend = runtime::resolve_backend(train.backend, c.placement, runtime::nccl_built());
      })) {
    return c;
  }
  const std::vector<std::string> node_gpus =
      env.node_allgather(c.placement.is_cuda() ? runtime::cuda_pci_bus_id(c.placement.index) : "cpu");
  if (!runtime::all_succeed(env, "device placement", [&] {
        if (!c.placement.is_cuda()) return;
        const int sharing = runtime::check_gpu_sharing(node_gpus, env.local_rank(), backend, env.hostname());
        if (sharing > 1 && env.local_rank() == 0) {
          log::warn("{} ranks share each GPU on {} (--backend mpi): timings are not per-GPU figures", sharing,
                    env.hostname());
        }
      })) {
    return c;
  }
  if (c.placement.is_cuda()) {
    log::info("rank {} -> {} ({}), backend {}", env.rank(), c.placement.str(),
              runtime::cuda_device_description(c.placement.index), runtime::backend_name(backend));
  }
  std::unique_ptr<runtime::Communicator> comm;
  if (!runtime::all_succeed(env, "creating the communicator", [&] {
        if (backend == runtime::Backend::kNccl) {
          comm = runtime::make_nccl_communicator(env.world(), c.placement.index, {train.comm_timeout_s});
        } else {
          comm = std::make_unique<runtime::MpiCommunicator>(env.world(), train.comm_timeout_s);
        }
      })) {
    return c;
  }
  c.comm = std::move(comm);
  return c;
}

/// The checkpoint identity of this job (checkpointer.h): the settings that change results, and
/// what `--device auto` and `--backend auto` resolved to here (a run started on the CPU does not
/// continue on a GPU, nor the other way round).
std::string job_identity(const JobConfig& config, const Connection& c) {
  return config.identity() + fmt::format("device (resolved) = {}\nbackend (resolved) = {}\n",
                                         c.placement.is_cuda() ? "cuda" : "cpu", runtime::backend_name(c.backend));
}

/// The run attributes every job records: the configuration, where and with what it ran.
h5::Attributes common_attributes(runtime::MpiEnvironment& env, const JobConfig& config, const std::string& task,
                                 const std::string& identity, const std::string& command_line) {
  h5::Attributes a{{"task", task}};
  for (auto&& option : config.table.attributes()) a.emplace_back(std::move(option));
  merge(a, {{"world_size", static_cast<std::int64_t>(env.world_size())},
            {"hosts", env.all_hosts()},
            {"started_utc", utc_now_iso8601()},
            {"mgbench_version", std::string(build_info::kVersion)},
            {"git_commit", std::string(build_info::kGitCommit)},
            {"torch_version", std::string(TORCH_VERSION)},
            {"cuda_runtime_version", runtime::cuda_runtime_version()},
            {"cuda_driver_version", runtime::cuda_driver_version()},
            {"cudnn_version", cudnn_version()},
            {"nccl_version", runtime::nccl_version()},
            {"mpi_version", env.library_version()},
            {"slurm_job_id", env_or("SLURM_JOB_ID", "")},
            {"command_line", command_line},
            {"config", config.ini()},
            {"config_id", config_id(identity)}});
  return a;
}

/// Creates the run in the results file, as agreed stages (rank 0 creates the directory; every
/// rank opens the file). nullptr when a stage failed (logged once; every rank returns).
std::unique_ptr<results::ResultsWriter> open_run(runtime::MpiEnvironment& env, const TrainOptions& train,
                                                 const h5::Attributes& run_attributes, h5::Attributes rank_attributes,
                                                 const results::RankLayout& layout) {
  rank_attributes.emplace_back("hostname", env.hostname());
  rank_attributes.emplace_back("local_rank", static_cast<std::int64_t>(env.local_rank()));
  rank_attributes.emplace_back("pid", static_cast<std::int64_t>(getpid()));
  // Its own stage: rank 0 alone creates the directory, and a failure there must reach the other
  // ranks through the agreement, not leave them in a barrier.
  if (!runtime::all_succeed(env, "creating the results directory", [&] {
        const auto parent = std::filesystem::path(train.results).parent_path();
        if (env.rank() == 0 && !parent.empty()) std::filesystem::create_directories(parent);
      })) {
    return nullptr;
  }
  std::unique_ptr<results::ResultsWriter> writer;
  if (!runtime::all_succeed(env, "opening the results file", [&] {
        writer = std::make_unique<results::ResultsWriter>(train.results, env.world(), train.run_name, run_attributes,
                                                          rank_attributes, layout);
      })) {
    return nullptr;
  }
  log::info("results: {} run {}", writer->path(), writer->run_id());
  return writer;
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

/// Starts recording the run, as agreed stages: continues `from` (a checkpoint of this
/// configuration, found before the set-up) in its own results file, or creates a new run.
/// nullptr when a stage failed (logged once; every rank returns).
std::unique_ptr<JobRun> start_run(runtime::MpiEnvironment& env, const TrainOptions& train,
                                  std::unique_ptr<Checkpointer> checkpointer,
                                  const std::optional<CheckpointManifest>& from, const h5::Attributes& run_attributes,
                                  const h5::Attributes& rank_attributes, const results::RankLayout& layout) {
  auto job = std::make_unique<JobRun>();
  job->checkpointer = std::move(checkpointer);
  if (from) {
    if (!runtime::all_succeed(env, "reading the checkpoint",
                              [&] { job->resume_state = job->checkpointer->load(*from); })) {
      return nullptr;
    }
    if (from->results != train.results) {
      log::info("--resume: the run continues in its own results file {} (not --results {})", from->results,
                train.results);
    }
    if (!runtime::all_succeed(env, "reopening the results file", [&] {
          job->writer = std::make_unique<results::ResultsWriter>(from->results, env.world(), from->run_id, layout);
        })) {
      return nullptr;
    }
    job->control.resume = &job->resume_state;
    log::info("results: {} run {} resumed from {} (global step {})", from->results, from->run_id, from->path,
              from->global_step);
  } else {
    job->writer = open_run(env, train, run_attributes, rank_attributes, layout);
    if (!job->writer) return nullptr;
  }
  job->stop = std::make_unique<runtime::StopAgreement>(env.world());
  job->control.checkpointer = job->checkpointer.get();
  job->control.stop = job->stop.get();
  return job;
}

/// Runs body (training). If it throws on any rank, that rank logs "<what> failed on rank r (host):
/// ...", marks the run failed in the results file and ends the whole job (MPI_Abort), so no rank
/// waits in a collective. Otherwise records the run "completed", or "preempted" (and says so)
/// (collective).
void run_or_abort(runtime::MpiEnvironment& env, results::ResultsWriter& writer, const std::string& what,
                  const std::function<void()>& body, const RunControl& control) {
  try {
    body();
  } catch (const std::exception& e) {
    log::error("{} failed on rank {} ({}): {}", what, env.rank(), env.hostname(), e.what());
    writer.mark_failed(e.what());
    env.abort(1);
  }
  writer.finish(control.preempted ? results::kStatusPreempted : results::kStatusCompleted);
  if (control.preempted) log::info("preempted: run {} in {} marked preempted", writer.run_id(), writer.path());
}

std::string done_line(const results::RunSummary& s, const char* unit) {
  std::string line =
      fmt::format("done: {} epoch(s) in {:.1f} s | loss {:.4f}", s.epochs_completed, s.total_s, s.final_loss);
  if (std::isfinite(s.test_accuracy)) line += fmt::format(" | test accuracy {:.2f} %", 100 * s.test_accuracy);
  if (std::isfinite(s.eval_loss)) line += fmt::format(" | eval loss {:.4f}", s.eval_loss);
  line += std::isfinite(s.tokens_per_s) ? fmt::format(" | {:.0f} tokens/s", s.tokens_per_s)
                                        : fmt::format(" | {:.1f} {}", s.samples_per_s, unit);
  line += fmt::format(" (all ranks) | {:.3f} s/it", s.s_per_it);
  if (std::isfinite(s.mfu)) line += fmt::format(" | MFU {:.1f} %", 100 * s.mfu);
  line += fmt::format(" | peak memory {:.0f} MiB", static_cast<double>(s.peak_memory_bytes) / (1024.0 * 1024.0));
  return line;
}

}  // namespace

int run_job(JobConfig& config, runtime::MpiEnvironment& env, const std::string& command_line) {
  // From the start: a stop requested during set-up takes effect at the first step boundary (a
  // checkpoint and exit 75, which the batch scripts requeue) instead of killing the job.
  runtime::install_stop_handlers();
  Connection connection = connect(env, config.train);
  if (!connection.comm) return 1;
  const bool eval_only = config.recipe->eval_only();
  const std::string task = eval_only ? config.task + "-eval" : config.task;
  const std::string identity = job_identity(config, connection);

  // Where the run starts, before the set-up (which may load gigabytes): a refused resume or an
  // already completed run costs nothing.
  std::unique_ptr<Checkpointer> checkpointer;
  std::optional<CheckpointManifest> from;
  if (!runtime::all_succeed(env, "setting up checkpoints", [&] {
        checkpointer = std::make_unique<Checkpointer>(config.train.checkpoint, env, task, identity);
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

  std::unique_ptr<TrainingLoop> loop;
  if (!runtime::all_succeed(env, "set-up", [&] {
        loop = std::make_unique<TrainingLoop>(config.train, *config.recipe, *connection.comm, connection.placement,
                                              env.local_size());
      })) {
    return 1;
  }
  h5::Attributes attributes = common_attributes(env, config, task, identity, command_line);
  merge(attributes, loop->run_attributes());
  const auto job =
      start_run(env, config.train, std::move(checkpointer), from, attributes, loop->rank_attributes(), loop->layout());
  if (!job) return 1;
  results::ResultsWriter& writer = *job->writer;
  Progress progress(env.rank() == 0, loop->throughput_unit(), config.train.progress_interval_s);
  results::RunSummary summary;
  run_or_abort(
      env, writer, eval_only ? "evaluation" : "training",
      [&] {
        summary = loop->run(writer, progress, job->control);
        if (!job->control.preempted) config.recipe->finish(env.rank());
      },
      job->control);
  if (job->control.preempted) return kExitPreempted;
  if (eval_only) {
    if (env.rank() == 0) std::cout << fmt::format("eval loss: {:.6f}\n", summary.eval_loss) << std::flush;
    return 0;
  }
  log::info("{} | {} run {}", done_line(summary, loop->throughput_unit()), writer.path(), writer.run_id());
  return 0;
}

}  // namespace mgbench::train
