#pragma once
// What every job (image, llm) does around its trainer: agreed set-up stages, rank -> device
// placement with the node's GPU-sharing check, the communicator, the run's common attributes.
#include <functional>
#include <memory>
#include <string>

#include "results/hdf5.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/mpi_env.h"

namespace mgbench::train {

/// Runs step on every rank; true when it succeeded everywhere. Otherwise the lowest failing rank
/// logs its error as "<stage> failed [on rank r]: ..." and every rank returns false (no hang, no abort).
bool all_succeed(runtime::MpiEnvironment& env, const char* stage, const std::function<void()>& step);

struct Connection {
  runtime::DevicePlacement placement;
  std::string backend;  // "nccl" | "mpi"
  std::unique_ptr<runtime::Communicator> comm;
};

/// Places this rank (--device), checks GPU sharing over the node, resolves --backend and creates
/// the communicator, each stage agreed over all ranks. Returns nullopt-like (comm == nullptr) when
/// a stage failed (already logged).
Connection connect(runtime::MpiEnvironment& env, const std::string& device, const std::string& backend,
                   double comm_timeout_s);

/// Attributes every run records: world size, hosts, start time, versions, SLURM job id, command
/// line, resolved config, run name. Collective (hosts).
h5::Attributes common_run_attributes(runtime::MpiEnvironment& env, const std::string& resolved_config,
                                     const std::string& command_line, const std::string& run_name);

/// Rank attributes every run records: hostname, local rank, pid.
h5::Attributes common_rank_attributes(runtime::MpiEnvironment& env);

/// Creates the results file's directory (rank 0) as an agreed stage. False when it failed.
bool create_results_directory(runtime::MpiEnvironment& env, const std::string& results_path);

}  // namespace mgbench::train
