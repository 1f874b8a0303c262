#pragma once
// What every MPI job of mgbench does around its work, whatever the work (training, the collective
// benchmark): place the rank on its device and open the communicator, record the run's common
// attributes, create the run in the results file, and end the whole job promptly when a rank
// fails. Each step is agreed over all ranks (runtime/agreement.h): a rank that cannot go on makes
// every rank return, the lowest failing rank saying why.
#include <functional>
#include <memory>
#include <string>

#include "core/host_memory.h"
#include "core/option_table.h"
#include "results/writer.h"
#include "runtime/backend.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/mpi_env.h"

namespace mgbench::session {

/// The options every MPI job has, declared where each job's table wants them (their order is part of
/// the configuration's text): --comm-timeout [s] (no effect on results), and --results and
/// --run-name (where the run is recorded; no effect either).
void declare_comm_timeout(options::OptionTable& table, double& seconds);
void declare_results(options::OptionTable& table, std::string& results, std::string& run_name);

/// Where this rank runs and how it talks to the others.
struct Connection {
  runtime::DevicePlacement placement;
  /// This rank's share of the host memory: the least limit it runs under (host_memory::
  /// host_memory_limit: physical memory or a cgroup's) divided by the ranks of its node under the
  /// same limit; its source says which and by how many ranks.
  host_memory::HostMemoryLimit host_memory;
  runtime::Backend backend = runtime::Backend::kMpi;  // resolved: never kAuto
  std::unique_ptr<runtime::Communicator> comm;        // nullptr: a stage failed (logged)
};

/// The rank attributes of the rank's GPU: gpu (model, memory, SMs), gpu_pci_bus_id and visible_gpus (the CUDA
/// devices the rank saw: 1 where the site confines each task to its own); none on the CPU.
h5::Attributes gpu_attributes(const runtime::DevicePlacement& placement);

/// Places this rank (--device: its GPU by local rank), finds its share of the host memory, checks that no two ranks of
/// a node share a GPU under NCCL, resolves --backend, initialises the device (`initialise`: runtime::
/// initialise_device; tests inject a failure there) and creates the communicator (timeout_s:
/// --comm-timeout), each stage agreed over all ranks: a rank that fails in one never leaves its
/// peers in the next stage's collectives (NCCL's unique-id broadcast). Returns with comm == nullptr
/// when a stage failed.
using DeviceInitialiser = std::function<void(const runtime::DevicePlacement&)>;
Connection connect(runtime::MpiEnvironment& env, runtime::DeviceRequest device, runtime::Backend backend,
                   double timeout_s, const DeviceInitialiser& initialise = runtime::initialise_device);

/// The run attributes every job records (docs/results-schema.md): task, every option of `table`,
/// world size, hosts, start time, versions of mgbench and the libraries, the SLURM job id, the
/// command line, the resolved configuration (INI) and its config_id (CRC-32 of identity).
h5::Attributes common_attributes(runtime::MpiEnvironment& env, const options::OptionTable& table,
                                 const std::string& task, const std::string& identity, const std::string& command_line);

/// Creates the run in the results file `path` (its directory made by rank 0), as agreed stages;
/// the rank attributes gain hostname, local_rank and pid. nullptr when a stage failed (logged
/// once; every rank returns).
std::unique_ptr<results::ResultsWriter> open_run(runtime::MpiEnvironment& env, const std::string& path,
                                                 const std::string& run_name, const h5::Attributes& run_attributes,
                                                 h5::Attributes rank_attributes, const results::RankLayout& layout);

/// Runs body. If it throws on any rank, that rank logs "<what> failed on rank r (host): ...",
/// marks the run failed in the results file and ends the whole job (MPI_Abort), so no rank waits
/// in a collective. Otherwise records the run (collective): "preempted" when *preempted is set after
/// body, "failed" with the message when *failure is not empty (every rank ran, the results are
/// wrong: the collective benchmark's check), else "completed".
void run_or_abort(runtime::MpiEnvironment& env, results::ResultsWriter& writer, const std::string& what,
                  const std::function<void()>& body, const bool* preempted = nullptr,
                  const std::string* failure = nullptr);

}  // namespace mgbench::session
