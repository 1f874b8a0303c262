#include "train/image_job.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>

#include <fmt/format.h>

#include "core/build_info.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/timer.h"
#include "results/writer.h"
#include "runtime/device.h"
#include "runtime/mpi_communicator.h"
#include "runtime/nccl_communicator.h"
#include "train/image_trainer.h"

namespace mgbench::train {
namespace {

/// Runs step on every rank; true when it succeeded everywhere. Otherwise the lowest failing
/// rank reports its error (ranks usually fail alike, e.g. a missing file) and all return false.
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

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

}  // namespace

int run_image_job(const ImageConfig& config, runtime::MpiEnvironment& env, const std::string& resolved_config,
                  const std::string& command_line) {
  // Device placement: every rank picks its GPU by local rank, then the node checks that no two
  // ranks share one (NCCL's rule) from the GPUs' PCI bus ids.
  runtime::DevicePlacement placement;
  std::string backend;
  if (!all_succeed(env, "device placement", [&] {
        placement = runtime::place_rank(config.device, runtime::visible_cuda_devices(), env.local_rank());
        backend = runtime::resolve_backend(config.backend, placement, runtime::nccl_built());
      })) {
    return 1;
  }
  const std::vector<std::string> node_gpus =
      runtime::node_allgather(env.world(), placement.is_cuda() ? runtime::cuda_pci_bus_id(placement.index) : "cpu");
  if (!all_succeed(env, "device placement", [&] {
        if (!placement.is_cuda()) return;
        const int sharing = runtime::check_gpu_sharing(node_gpus, env.local_rank(), backend, env.hostname());
        if (sharing > 1 && env.local_rank() == 0) {
          log::warn("{} ranks share each GPU on {} (--backend mpi): timings are not per-GPU figures", sharing,
                    env.hostname());
        }
      })) {
    return 1;
  }
  if (placement.is_cuda()) {
    log::info("rank {} -> {} ({}), backend {}", env.rank(), placement.str(),
              runtime::cuda_device_description(placement.index), backend);
  }

  std::unique_ptr<runtime::Communicator> comm;
  if (!all_succeed(env, "creating the communicator", [&] {
        if (backend == "nccl") {
          comm = runtime::make_nccl_communicator(env.world(), placement.index, {config.comm_timeout_s});
        } else {
          comm = std::make_unique<runtime::MpiCommunicator>(env.world());
        }
      })) {
    return 1;
  }
  std::unique_ptr<ImageTrainer> trainer;
  if (!all_succeed(env, "set-up", [&] {
        trainer = std::make_unique<ImageTrainer>(config, *comm, env.local_size(), placement);
        trainer->load_data();
      })) {
    return 1;
  }

  h5::Attributes run_attributes = trainer->run_attributes();
  const std::string hosts = env.all_hosts();
  for (auto&& [name, value] : h5::Attributes{
           {"world_size", static_cast<std::int64_t>(env.world_size())},
           {"hosts", hosts},
           {"started_utc", utc_now_iso8601()},
           {"mgbench_version", std::string(build_info::kVersion)},
           {"git_commit", std::string(build_info::kGitCommit)},
           {"mpi_version", env.library_version()},
           {"slurm_job_id", env_or("SLURM_JOB_ID", "")},
           {"command_line", command_line},
           {"config", resolved_config},
           {"run_name", config.run_name}}) {
    run_attributes.emplace_back(name, value);
  }
  h5::Attributes rank_attributes = trainer->rank_attributes();
  rank_attributes.emplace_back("hostname", env.hostname());
  rank_attributes.emplace_back("local_rank", static_cast<std::int64_t>(env.local_rank()));
  rank_attributes.emplace_back("pid", static_cast<std::int64_t>(getpid()));

  std::unique_ptr<results::ResultsWriter> writer;
  // Its own stage: rank 0 alone creates the directory, and a failure there must reach the other
  // ranks through the agreement, not leave them in a barrier.
  if (!all_succeed(env, "creating the results directory", [&] {
        const auto parent = std::filesystem::path(config.results).parent_path();
        if (env.rank() == 0 && !parent.empty()) std::filesystem::create_directories(parent);
      })) {
    return 1;
  }
  if (!all_succeed(env, "opening the results file", [&] {
        writer = std::make_unique<results::ResultsWriter>(config.results, env.world(), config.run_name,
                                                          run_attributes, rank_attributes,
                                                          trainer->layout());
      })) {
    return 1;
  }
  log::info("results: {} run {}", writer->path(), writer->run_id());

  Progress progress(env.rank() == 0, "img/s", config.progress_interval_s);
  results::RunSummary summary;
  try {
    summary = trainer->run(*writer, progress);
  } catch (const std::exception& e) {
    log::error("training failed on rank {} ({}): {}", env.rank(), env.hostname(), e.what());
    writer->mark_failed(e.what());
    env.abort(1);
  }
  writer->finish(results::kStatusCompleted);
  log::info("done: {} epochs in {:.1f} s | test accuracy {:.2f} % | {:.1f} img/s (all ranks) | {} run {}",
            summary.epochs_completed, summary.total_s, 100 * summary.test_accuracy, summary.samples_per_s,
            config.results, writer->run_id());
  return 0;
}

}  // namespace mgbench::train
