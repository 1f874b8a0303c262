#include "session/session.h"

#include <unistd.h>

#include <torch/version.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include <ATen/detail/CUDAHooksInterface.h>
#include <fmt/format.h>

#include "core/build_info.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "core/option_table.h"
#include "core/timer.h"
#include "core/watchdog.h"
#include "runtime/agreement.h"
#include "runtime/nccl_communicator.h"
#include "session/platform.h"

namespace mgbench::session {
namespace {

/// The cuDNN library LibTorch loaded (cudnnGetVersion: 91000 -> "9.10.0"); "" without CUDA.
std::string cudnn_version() {
  try {
    const long v = at::detail::getCUDAHooks().versionRuntimeCuDNN();
    return v > 0 ? fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100) : "";
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace

void declare_comm_timeout(options::OptionTable& t, double& seconds) {
  t.add("comm-timeout", seconds, "seconds a collective may stay in flight before the job is aborted [s]")
      .above(0)
      .no_effect();
}

void declare_results(options::OptionTable& t, std::string& results, std::string& run_name) {
  t.add("results", results, "HDF5 results file (created or appended to)")
      .check([](const std::string& s) { return !s.empty(); }, "a file path")
      .no_effect();
  t.add("run-name", run_name, "name appended to the run id").no_effect();
}

h5::Attributes gpu_attributes(const runtime::DevicePlacement& placement) {
  if (!placement.is_cuda()) return {};
  return {{"gpu", runtime::cuda_device_description(placement.index)},
          {"gpu_pci_bus_id", runtime::cuda_pci_bus_id(placement.index)},
          {"visible_gpus", static_cast<std::int64_t>(runtime::visible_cuda_devices())}};
}

namespace {

/// limit over the ranks of this node under the same limit. Collective over the world.
host_memory::HostMemoryLimit host_memory_share(runtime::MpiEnvironment& env, host_memory::HostMemoryLimit limit) {
  const std::vector<std::string> node = env.node_allgather(limit.source);
  const auto ranks = std::count(node.begin(), node.end(), limit.source);
  if (ranks > 1) {
    limit.bytes /= ranks;
    limit.source = fmt::format("{}, shared by {} ranks of {}", limit.source, ranks, env.hostname());
  }
  return limit;
}

}  // namespace

Connection connect(runtime::MpiEnvironment& env, runtime::DeviceRequest device, runtime::Backend requested,
                   double timeout_s, const DeviceInitialiser& initialise) {
  // From here on every blocking stage that waits on other ranks has --comm-timeout to finish.
  watchdog::set_default_timeout(timeout_s);
  Connection c;
  runtime::Backend& backend = c.backend;
  // Every rank picks its GPU by local rank, then the node checks that no two ranks share one
  // (NCCL's rule; the backend's row says) from the GPUs' PCI bus ids.
  if (!runtime::all_succeed(env, "device placement", [&] {
        c.placement = runtime::place_rank(device, runtime::visible_cuda_devices(), env.local_rank());
        backend = runtime::resolve_backend(requested, c.placement);
      })) {
    return c;
  }
  c.host_memory = host_memory_share(env, host_memory::host_memory_limit());
  const std::vector<std::string> node_gpus =
      env.node_allgather(c.placement.is_cuda() ? runtime::cuda_pci_bus_id(c.placement.index) : "cpu");
  if (c.placement.is_cuda()) {
    std::vector<int> visible;
    for (const std::string& n : env.node_allgather(std::to_string(runtime::visible_cuda_devices()))) {
      visible.push_back(std::stoi(n));
    }
    const std::string warning = runtime::single_device_warning(visible, env.hostname());
    if (!warning.empty() && env.local_rank() == 0) log::warn("{}", warning);
  }
  if (!runtime::all_succeed(env, "device placement", [&] {
        if (!c.placement.is_cuda()) return;
        const int sharing = runtime::check_gpu_sharing(node_gpus, env.local_rank(), backend, env.hostname());
        c.placement.ranks_on_device = sharing;
        if (sharing > 1 && env.local_rank() == 0) {
          log::warn("{} ranks share each GPU on {} (--backend {}): timings are not per-GPU figures", sharing,
                    env.hostname(), runtime::backend_name(backend));
        }
      })) {
    return c;
  }
  if (c.placement.is_cuda()) {
    log::info("rank {} -> {} ({}), backend {}", env.rank(), c.placement.str(),
              runtime::cuda_device_description(c.placement.index), runtime::backend_name(backend));
  }
  // CUDA's first calls in a stage of their own: a rank whose GPU refuses a context must not leave
  // its peers in the NCCL bootstrap's broadcast, which has no deadline (issue 32).
  if (!runtime::all_succeed(env, "initialising the device", [&] { initialise(c.placement); })) return c;
  std::unique_ptr<runtime::Communicator> comm;
  if (!runtime::all_succeed(env, "creating the communicator", [&] {
        comm = runtime::backend_info(backend).make(env.world(), c.placement.index, timeout_s);
      })) {
    return c;
  }
  c.comm = std::move(comm);
  return c;
}

h5::Attributes common_attributes(runtime::MpiEnvironment& env, const options::OptionTable& table,
                                 const std::string& task, const std::string& identity,
                                 const std::string& command_line) {
  h5::Attributes a{{"task", task}};
  for (auto&& option : table.attributes()) a.emplace_back(std::move(option));
  const std::string hosts = env.all_hosts();
  h5::merge_attributes(a, {{"world_size", static_cast<std::int64_t>(env.world_size())},
                           {"hosts", hosts},
                           {"started_utc", utc_now_iso8601()},
                           {"mgbench_version", std::string(build_info::kVersion)},
                           {"git_commit", std::string(build_info::kGitCommit)},
                           {"torch_version", std::string(TORCH_VERSION)},
                           {"cuda_runtime_version", runtime::cuda_runtime_version()},
                           {"cuda_driver_version", runtime::cuda_driver_version()},
                           {"cudnn_version", cudnn_version()},
                           {"nccl_version", runtime::nccl_version()},
                           {"mpi_version", env.library_version()},
                           {"host_malloc", host_memory::process_allocator().describe()},
                           {"command_line", command_line},
                           {"config", table.ini()},
                           {"config_id", options::config_id(identity)}});
  h5::merge_attributes(a, platform_attributes(hosts));
  return a;
}

std::unique_ptr<results::ResultsWriter> open_run(runtime::MpiEnvironment& env, const std::string& path,
                                                 const std::string& run_name, const h5::Attributes& run_attributes,
                                                 h5::Attributes rank_attributes, const results::RankLayout& layout) {
  rank_attributes.emplace_back("hostname", env.hostname());
  rank_attributes.emplace_back("local_rank", static_cast<std::int64_t>(env.local_rank()));
  rank_attributes.emplace_back("pid", static_cast<std::int64_t>(getpid()));
  // One file for every rank: ranks launched with other paths (an MPMD launch, a per-node script)
  // each waited in the other file's collective creation until --comm-timeout, leaving it empty.
  const std::string absolute = std::filesystem::absolute(path).lexically_normal().string();
  const runtime::MpiEnvironment::Spread named =
      env.spread(static_cast<double>(std::stoul(options::config_id(absolute), nullptr, 16)));
  if (named.min != named.max) {
    if (env.rank() == 0) {
      log::error(
          "the ranks name other results files (rank 0: '{}'): every rank must be started with the same "
          "--results",
          absolute);
    }
    return nullptr;
  }
  // Its own stage: rank 0 alone creates the directory, and a failure there must reach the other
  // ranks through the agreement, not leave them in a barrier.
  if (!runtime::all_succeed(env, "creating the results directory", [&] {
        const auto parent = std::filesystem::path(path).parent_path();
        if (env.rank() == 0 && !parent.empty()) std::filesystem::create_directories(parent);
      })) {
    return nullptr;
  }
  std::unique_ptr<results::ResultsWriter> writer;
  if (!runtime::all_succeed(env, "opening the results file", [&] {
        writer = std::make_unique<results::ResultsWriter>(path, env.world(), run_name, run_attributes, rank_attributes,
                                                          layout);
      })) {
    return nullptr;
  }
  log::info("results: {} run {}", writer->path(), writer->run_id());
  return writer;
}

void run_or_abort(runtime::MpiEnvironment& env, results::ResultsWriter& writer, const std::string& what,
                  const std::function<void()>& body, const bool* preempted, const std::string* failure) {
  try {
    body();
  } catch (const std::exception& e) {
    const std::string message = error_message(e);
    log::error("{} failed on rank {} ({}): {}", what, env.rank(), env.hostname(), message);
    writer.mark_failed(message);
    env.abort(1);
  }
  const bool stopped = preempted != nullptr && *preempted;
  if (failure != nullptr && !failure->empty()) {
    writer.finish(results::kStatusFailed, *failure);
    return;
  }
  writer.finish(stopped ? results::kStatusPreempted : results::kStatusCompleted);
  if (stopped) log::info("preempted: run {} in {} marked preempted", writer.run_id(), writer.path());
}

}  // namespace mgbench::session
