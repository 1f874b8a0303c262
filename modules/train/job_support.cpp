#include "train/job_support.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "core/build_info.h"
#include "core/log.h"
#include "core/timer.h"
#include "runtime/mpi_communicator.h"
#include "runtime/nccl_communicator.h"

namespace mgbench::train {
namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

}  // namespace

bool all_succeed(runtime::MpiEnvironment& env, const char* stage, const std::function<void()>& step) {
  std::string error;
  try {
    step();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const int first_failing = env.first_failing_rank(error.empty());
  if (first_failing < 0) return true;
  if (env.rank() == first_failing) {
    log::error("{} failed{}: {}", stage, env.world_size() > 1 ? fmt::format(" on rank {}", env.rank()) : "", error);
  }
  return false;
}

Connection connect(runtime::MpiEnvironment& env, const std::string& device, const std::string& backend,
                   double comm_timeout_s) {
  Connection c;
  // Every rank picks its GPU by local rank, then the node checks that no two ranks share one
  // (NCCL's rule) from the GPUs' PCI bus ids.
  if (!all_succeed(env, "device placement", [&] {
        c.placement = runtime::place_rank(device, runtime::visible_cuda_devices(), env.local_rank());
        c.backend = runtime::resolve_backend(backend, c.placement, runtime::nccl_built());
      })) {
    return c;
  }
  const std::vector<std::string> node_gpus =
      env.node_allgather(c.placement.is_cuda() ? runtime::cuda_pci_bus_id(c.placement.index) : "cpu");
  if (!all_succeed(env, "device placement", [&] {
        if (!c.placement.is_cuda()) return;
        const int sharing = runtime::check_gpu_sharing(node_gpus, env.local_rank(), c.backend, env.hostname());
        if (sharing > 1 && env.local_rank() == 0) {
          log::warn("{} ranks share each GPU on {} (--backend mpi): timings are not per-GPU figures", sharing,
                    env.hostname());
        }
      })) {
    return c;
  }
  if (c.placement.is_cuda()) {
    log::info("rank {} -> {} ({}), backend {}", env.rank(), c.placement.str(),
              runtime::cuda_device_description(c.placement.index), c.backend);
  }
  std::unique_ptr<runtime::Communicator> comm;
  if (!all_succeed(env, "creating the communicator", [&] {
        if (c.backend == "nccl") {
          comm = runtime::make_nccl_communicator(env.world(), c.placement.index, {comm_timeout_s});
        } else {
          comm = std::make_unique<runtime::MpiCommunicator>(env.world());
        }
      })) {
    return c;
  }
  c.comm = std::move(comm);
  return c;
}

namespace {

h5::Attributes common_run_attributes(runtime::MpiEnvironment& env, const RunIdentity& run) {
  return {{"world_size", static_cast<std::int64_t>(env.world_size())},
          {"hosts", env.all_hosts()},
          {"started_utc", utc_now_iso8601()},
          {"mgbench_version", std::string(build_info::kVersion)},
          {"git_commit", std::string(build_info::kGitCommit)},
          {"mpi_version", env.library_version()},
          {"slurm_job_id", env_or("SLURM_JOB_ID", "")},
          {"command_line", run.command_line},
          {"config", run.resolved_config},
          {"run_name", run.run_name}};
}

}  // namespace

std::unique_ptr<results::ResultsWriter> open_run(runtime::MpiEnvironment& env, const RunIdentity& run,
                                                 h5::Attributes run_attributes, h5::Attributes rank_attributes,
                                                 const results::RankLayout& layout) {
  for (auto&& a : common_run_attributes(env, run)) run_attributes.push_back(std::move(a));
  rank_attributes.emplace_back("hostname", env.hostname());
  rank_attributes.emplace_back("local_rank", static_cast<std::int64_t>(env.local_rank()));
  rank_attributes.emplace_back("pid", static_cast<std::int64_t>(getpid()));
  // Its own stage: rank 0 alone creates the directory, and a failure there must reach the other
  // ranks through the agreement, not leave them in a barrier.
  if (!all_succeed(env, "creating the results directory", [&] {
        const auto parent = std::filesystem::path(run.results).parent_path();
        if (env.rank() == 0 && !parent.empty()) std::filesystem::create_directories(parent);
      })) {
    return nullptr;
  }
  std::unique_ptr<results::ResultsWriter> writer;
  if (!all_succeed(env, "opening the results file", [&] {
        writer = std::make_unique<results::ResultsWriter>(run.results, env.world(), run.run_name, run_attributes,
                                                          rank_attributes, layout);
      })) {
    return nullptr;
  }
  log::info("results: {} run {}", writer->path(), writer->run_id());
  return writer;
}

std::string run_configuration_text(const std::string& task, const h5::Attributes& job_attributes) {
  std::string text = job_attributes.empty() || job_attributes.front().first != "task" ? "task=" + task + "\n" : "";
  for (const auto& [name, value] : job_attributes) text += name + "=" + h5::exact_text(value) + "\n";
  return text;
}

std::unique_ptr<JobRun> start_run(runtime::MpiEnvironment& env, const RunIdentity& run,
                                  const CheckpointOptions& checkpoints, const std::string& task,
                                  h5::Attributes run_attributes, h5::Attributes rank_attributes,
                                  const results::RankLayout& layout) {
  auto job = std::make_unique<JobRun>();
  if (!all_succeed(env, "setting up checkpoints", [&] {
        job->checkpointer =
            std::make_unique<Checkpointer>(checkpoints, env, task, run_configuration_text(task, run_attributes));
      })) {
    return nullptr;
  }
  if (checkpoints.resume) {
    const auto find_latest = [&] { job->resumed_from = job->checkpointer->latest(); };
    if (!all_succeed(env, "looking for a checkpoint to resume", find_latest)) {
      return nullptr;
    }
    if (!job->resumed_from) {
      log::info("--resume: no checkpoint of this configuration in {}: starting a new run",
                job->checkpointer->directory());
    } else if (job->resumed_from->completed) {
      log::info("--resume: run {} in {} already completed (checkpoint {}): nothing to do", job->resumed_from->run_id,
                job->resumed_from->results, job->resumed_from->path);
      job->already_completed = true;
      return job;
    } else {
      const CheckpointManifest& from = *job->resumed_from;
      if (!all_succeed(env, "reading the checkpoint", [&] { job->resume_state = job->checkpointer->load(from); })) {
        return nullptr;
      }
      if (from.results != run.results) {
        log::info("--resume: the run continues in its own results file {} (not --results {})", from.results,
                  run.results);
      }
      if (!all_succeed(env, "reopening the results file", [&] {
            job->writer = std::make_unique<results::ResultsWriter>(from.results, env.world(), from.run_id, layout);
          })) {
        return nullptr;
      }
      job->control.resume = &job->resume_state;
      log::info("results: {} run {} resumed from {} (global step {})", from.results, from.run_id, from.path,
                from.global_step);
    }
  }
  if (!job->writer) {
    job->writer = open_run(env, run, std::move(run_attributes), std::move(rank_attributes), layout);
    if (!job->writer) return nullptr;
  }
  job->stop = std::make_unique<runtime::StopAgreement>(env.world());
  job->control.checkpointer = job->checkpointer.get();
  job->control.stop = job->stop.get();
  return job;
}

void run_or_abort(runtime::MpiEnvironment& env, results::ResultsWriter& writer, const char* what,
                  const std::function<void()>& body, const RunControl* control) {
  try {
    body();
  } catch (const std::exception& e) {
    log::error("{} failed on rank {} ({}): {}", what, env.rank(), env.hostname(), e.what());
    writer.mark_failed(e.what());
    env.abort(1);
  }
  const bool preempted = control != nullptr && control->preempted;
  writer.finish(preempted ? results::kStatusPreempted : results::kStatusCompleted);
  if (preempted) log::info("preempted: run {} in {} marked preempted", writer.run_id(), writer.path());
}

}  // namespace mgbench::train
