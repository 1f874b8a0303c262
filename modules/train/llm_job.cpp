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
  Connection connection = connect(env, config.device, config.backend, config.comm_timeout_s);
  if (!connection.comm) return 1;
  std::unique_ptr<LlmTuner> tuner;
  if (!all_succeed(env, "set-up", [&] {
        tuner = std::make_unique<LlmTuner>(config, *connection.comm, connection.placement);
        tuner->load();
      })) {
    return 1;
  }
  h5::Attributes run_attributes = tuner->run_attributes();
  for (auto&& a : common_run_attributes(env, resolved_config, command_line, config.run_name)) {
    run_attributes.push_back(std::move(a));
  }
  h5::Attributes rank_attributes = tuner->rank_attributes();
  for (auto&& a : common_rank_attributes(env)) rank_attributes.push_back(std::move(a));
  if (!create_results_directory(env, config.results)) return 1;
  std::unique_ptr<results::ResultsWriter> writer;
  if (!all_succeed(env, "opening the results file", [&] {
        writer = std::make_unique<results::ResultsWriter>(config.results, env.world(), config.run_name, run_attributes,
                                                          rank_attributes, tuner->layout());
      })) {
    return 1;
  }
  log::info("results: {} run {}", writer->path(), writer->run_id());
  Progress progress(env.rank() == 0, "tok/s", config.progress_interval_s);
  results::RunSummary summary;
  try {
    summary = tuner->run(*writer, progress);
    if (!config.output_dir.empty() && !config.eval_only && env.rank() == 0) tuner->save_adapter(config.output_dir);
  } catch (const std::exception& e) {
    log::error("{} failed on rank {} ({}): {}", config.eval_only ? "evaluation" : "fine-tuning", env.rank(),
               env.hostname(), e.what());
    writer->mark_failed(e.what());
    env.abort(1);
  }
  writer->finish(results::kStatusCompleted);
  if (config.eval_only) {
    if (env.rank() == 0) std::cout << fmt::format("eval loss: {:.6f}\n", summary.eval_loss) << std::flush;
    return 0;
  }
  log::info("done: {} epoch(s) | loss {:.4f} | {:.3f} s/it | {:.0f} tokens/s (all ranks) | peak memory {:.0f} MiB | "
            "MFU {} | {} run {}",
            summary.epochs_completed, summary.final_loss, summary.s_per_it, summary.tokens_per_s,
            static_cast<double>(summary.peak_memory_bytes) / (1024.0 * 1024.0),
            std::isfinite(summary.mfu) ? fmt::format("{:.1f} %", 100 * summary.mfu) : std::string("n/a (no device peak)"),
            config.results, writer->run_id());
  if (!config.output_dir.empty()) log::info("adapters: {} (PEFT format)", config.output_dir);
  return 0;
}

}  // namespace mgbench::train
