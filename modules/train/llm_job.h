#pragma once
// The lifecycle of one `mgbench llm` run on one rank, as image_job.h: agreed set-up, the run in
// the results file, fine-tuning (or --eval-only), adapters written by rank 0, the outcome.
#include <string>

#include "runtime/mpi_env.h"
#include "train/llm_config.h"

namespace mgbench::train {

/// Returns the process exit code: 0 done, 1 a set-up failure (every rank exits cleanly), 75 the
/// run stopped on SIGTERM / SIGUSR1 and was marked preempted (job_support.h). A
/// failure during training marks the run failed and aborts the job.
int run_llm_job(const LlmConfig& config, runtime::MpiEnvironment& env, const std::string& resolved_config,
                const std::string& command_line);

}  // namespace mgbench::train
