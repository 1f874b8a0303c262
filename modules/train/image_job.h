#pragma once
// The lifecycle of one `mgbench image` run on one rank: set up (ranks fail together, cleanly,
// when any rank cannot start), create the run in the results file, train, record the outcome.
// A rank that fails after the run has started marks the run failed and aborts the whole job
// (MPI_Abort), so no rank is left waiting in a collective.
#include <string>

#include "runtime/mpi_env.h"
#include "train/image_config.h"

namespace mgbench::train {

/// Returns the process exit code (0 on success, 1 when set-up failed on some rank, 75 when the run
/// stopped on SIGTERM / SIGUSR1 and was marked preempted: job_support.h). Does not
/// return when training fails after the run started (the job is aborted).
/// resolved_config: the configuration as INI text, stored with the run; command_line: argv.
int run_image_job(const ImageConfig& config, runtime::MpiEnvironment& env, const std::string& resolved_config,
                  const std::string& command_line);

}  // namespace mgbench::train
