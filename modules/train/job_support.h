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
#include "runtime/stop_request.h"
#include "train/checkpoint.h"

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

/// Exit code of a run that stopped early on SIGTERM / SIGUSR1 (sysexits' EX_TEMPFAIL, "try
/// again"): the batch scripts requeue the job on it.
inline constexpr int kExitPreempted = 75;

/// A run being recorded, with its preemption and resume machinery.
struct JobRun {
  std::unique_ptr<results::ResultsWriter> writer;
  std::unique_ptr<Checkpointer> checkpointer;
  std::unique_ptr<runtime::StopAgreement> stop;
  std::optional<CheckpointManifest> resumed_from;
  CheckpointState resume_state;
  RunControl control;              // points into this object: JobRun does not move
  bool already_completed = false;  // --resume found the run finished: nothing to do
};

/// The configuration text that names a run configuration's checkpoints: the job's run attributes
/// as "name=value" lines, led by "task=<task>" unless they start with it. Not the world size: a
/// resume with another number of ranks is refused with a message, not silently started afresh.
std::string run_configuration_text(const std::string& task, const h5::Attributes& job_attributes);

/// Starts recording a run, as agreed stages: with --resume, looks for the latest checkpoint of
/// this configuration (checkpoint.h) and, when there is one, reads this rank's state and continues
/// its run in its results file (the checkpoint's, which may differ from run.results); otherwise
/// creates a new run (open_run). nullptr when a stage failed (logged once; every rank returns).
/// The job installs the stop-signal handlers (runtime/stop_request.h) before its set-up, not here.
std::unique_ptr<JobRun> start_run(runtime::MpiEnvironment& env, const RunIdentity& run,
                                  const CheckpointOptions& checkpoints, const std::string& task,
                                  h5::Attributes run_attributes, h5::Attributes rank_attributes,
                                  const results::RankLayout& layout);

/// Runs body (training). If it throws on any rank, that rank logs "<what> failed on rank r (host):
/// ...", marks the run failed in the results file and ends the whole job (MPI_Abort), so no rank
/// waits in a collective. Otherwise records the run "completed", or "preempted" (and says so) when
/// control->preempted (collective).
void run_or_abort(runtime::MpiEnvironment& env, results::ResultsWriter& writer, const char* what,
                  const std::function<void()>& body, const RunControl* control = nullptr);

}  // namespace mgbench::train
