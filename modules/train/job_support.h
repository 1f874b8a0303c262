#pragma once
// What every job (image, llm) does around its trainer: agreed set-up stages, rank -> device
// placement with the node's GPU-sharing check, the communicator, the run's common attributes.
#include <functional>
#include <memory>
#include <string>

#include "results/hdf5.h"
#include "results/writer.h"
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

/// Where and how a run is recorded (the options every job has).
struct RunIdentity {
  std::string results;          // --results
  std::string run_name;         // --run-name
  std::string resolved_config;  // the resolved options as INI
  std::string command_line;
};

/// Creates the run in the results file with the job's attributes plus the common ones, as agreed
/// stages (rank 0 creates the directory; every rank opens the file). nullptr when a stage failed
/// (logged once; every rank returns).
std::unique_ptr<results::ResultsWriter> open_run(runtime::MpiEnvironment& env, const RunIdentity& run,
                                                 h5::Attributes run_attributes, h5::Attributes rank_attributes,
                                                 const results::RankLayout& layout);

/// Runs body (training). If it throws on any rank, that rank logs "<what> failed on rank r (host):
/// ...", marks the run failed in the results file and ends the whole job (MPI_Abort), so no rank
/// waits in a collective. Otherwise records the run completed (collective).
void run_or_abort(runtime::MpiEnvironment& env, results::ResultsWriter& writer, const char* what,
                  const std::function<void()>& body);

}  // namespace mgbench::train
