#include "train/llm_job.h"

#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "core/log.h"
#include "core/progress.h"
#include "results/writer.h"
#include "train/job_support.h"
#include "train/llm_tuner.h"

namespace mgbench::train {

int run_llm_job(const LlmConfig& config, runtime::MpiEnvironment& env, const std::string& resolved_config,
                const std::string& command_line) {
  // From the start: a stop requested during set-up takes effect at the first step boundary (a
  // checkpoint and exit 75, which the batch scripts requeue) instead of killing the job.
  runtime::install_stop_handlers();
  Connection connection = connect(env, config.device, config.backend, config.comm_timeout_s);
  if (!connection.comm) return 1;
  std::unique_ptr<LlmTuner> tuner;
  if (!all_succeed(env, "set-up", [&] {
        tuner = std::make_unique<LlmTuner>(config, *connection.comm, connection.placement);
        tuner->load();
      })) {
    return 1;
  }
  const auto job = start_run(env, {config.results, config.run_name, resolved_config, command_line}, config.checkpoint,
                             "llm", tuner->run_attributes(), tuner->rank_attributes(), tuner->layout());
  if (!job) return 1;
  if (job->already_completed) return 0;
  results::ResultsWriter& writer = *job->writer;
  Progress progress(env.rank() == 0, "tok/s", config.progress_interval_s);
  results::RunSummary summary;
  run_or_abort(
      env, writer, config.eval_only ? "evaluation" : "fine-tuning",
      [&] {
        summary = tuner->run(writer, progress, &job->control);
        if (!config.output_dir.empty() && !config.eval_only && !job->control.preempted && env.rank() == 0) {
          tuner->save_adapter(config.output_dir);
        }
      },
      &job->control);
  if (job->control.preempted) return kExitPreempted;
  if (config.eval_only) {
    if (env.rank() == 0) std::cout << fmt::format("eval loss: {:.6f}\n", summary.eval_loss) << std::flush;
    return 0;
  }
  log::info(
      "done: {} epoch(s) | loss {:.4f} | {:.3f} s/it | {:.0f} tokens/s (all ranks) | peak memory {:.0f} MiB | "
      "MFU {} | {} run {}",
      summary.epochs_completed, summary.final_loss, summary.s_per_it, summary.tokens_per_s,
      static_cast<double>(summary.peak_memory_bytes) / (1024.0 * 1024.0),
      std::isfinite(summary.mfu) ? fmt::format("{:.1f} %", 100 * summary.mfu) : std::string("n/a (no device peak)"),
      writer.path(), writer.run_id());
  if (!config.output_dir.empty()) log::info("adapters: {} (PEFT format)", config.output_dir);
  return 0;
}

}  // namespace mgbench::train
