#pragma once
// The lifecycle of one job on one rank, the same for every recipe: the stop-signal handlers; the
// rank's device and the communicator; where the run starts (with --resume, the checkpoint of the
// same configuration; refusals of another configuration's come here, before any loading); the
// set-up of the recipe and the training loop, agreed by all ranks (a rank that cannot start makes
// every rank exit cleanly); the run created in the results file, or continued in its own; training;
// the outcome recorded. A rank that fails after the run has started marks the run
// failed and aborts the whole job (MPI_Abort), so no rank is left waiting in a collective.
#include <string>

#include "runtime/mpi_env.h"
#include "runtime/stop_request.h"
#include "train/job_config.h"

namespace mgbench::train {

/// Exit code of a run that stopped early on SIGTERM / SIGUSR1 (sysexits' EX_TEMPFAIL, "try
/// again"): the batch scripts requeue the job on it.
inline constexpr int kExitPreempted = runtime::kExitStopped;

/// Runs the job of config (validated) on this rank. Returns the process exit code: 0 done, 1 a
/// set-up failure (every rank exits cleanly, the lowest failing rank says why), 75 preempted.
/// Does not return when the run fails after it started (the job is aborted). command_line: argv,
/// stored with the run. With an evaluate-only recipe, rank 0 prints "eval loss: <value>".
int run_job(JobConfig& config, runtime::MpiEnvironment& env, const std::string& command_line);

}  // namespace mgbench::train
