#include "train/image_job.h"

#include <memory>

#include "core/log.h"
#include "core/progress.h"
#include "results/writer.h"
#include "train/image_trainer.h"
#include "train/job_support.h"

namespace mgbench::train {

int run_image_job(const ImageConfig& config, runtime::MpiEnvironment& env, const std::string& resolved_config,
                  const std::string& command_line) {
  Connection connection = connect(env, config.device, config.backend, config.comm_timeout_s);
  if (!connection.comm) return 1;
  runtime::Communicator& comm = *connection.comm;
  const runtime::DevicePlacement placement = connection.placement;
  std::unique_ptr<ImageTrainer> trainer;
  if (!all_succeed(env, "set-up", [&] {
        trainer = std::make_unique<ImageTrainer>(config, comm, env.local_size(), placement);
        trainer->load_data();
      })) {
    return 1;
  }

  h5::Attributes run_attributes = trainer->run_attributes();
  for (auto&& attribute : common_run_attributes(env, resolved_config, command_line, config.run_name)) {
    run_attributes.push_back(std::move(attribute));
  }
  h5::Attributes rank_attributes = trainer->rank_attributes();
  for (auto&& attribute : common_rank_attributes(env)) rank_attributes.push_back(std::move(attribute));

  std::unique_ptr<results::ResultsWriter> writer;
  if (!create_results_directory(env, config.results)) return 1;
  if (!all_succeed(env, "opening the results file", [&] {
        writer = std::make_unique<results::ResultsWriter>(config.results, env.world(), config.run_name,
                                                          run_attributes, rank_attributes,
                                                          trainer->layout());
      })) {
    return 1;
  }
  log::info("results: {} run {}", writer->path(), writer->run_id());

  Progress progress(env.rank() == 0, "img/s", config.progress_interval_s);
  results::RunSummary summary;
  try {
    summary = trainer->run(*writer, progress);
  } catch (const std::exception& e) {
    log::error("training failed on rank {} ({}): {}", env.rank(), env.hostname(), e.what());
    writer->mark_failed(e.what());
    env.abort(1);
  }
  writer->finish(results::kStatusCompleted);
  log::info("done: {} epochs in {:.1f} s | test accuracy {:.2f} % | {:.1f} img/s (all ranks) | {} run {}",
            summary.epochs_completed, summary.total_s, 100 * summary.test_accuracy, summary.samples_per_s,
            config.results, writer->run_id());
  return 0;
}

}  // namespace mgbench::train
