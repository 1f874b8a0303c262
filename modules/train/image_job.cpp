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
  // From the start: a stop requested during set-up takes effect at the first step boundary (a
  // checkpoint and exit 75, which the batch scripts requeue) instead of killing the job.
  runtime::install_stop_handlers();
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

  const auto job = start_run(env, {config.results, config.run_name, resolved_config, command_line}, config.checkpoint,
                             "image", trainer->run_attributes(), trainer->rank_attributes(), trainer->layout());
  if (!job) return 1;
  if (job->already_completed) return 0;
  results::ResultsWriter& writer = *job->writer;
  Progress progress(env.rank() == 0, "img/s", config.progress_interval_s);
  results::RunSummary summary;
  run_or_abort(
      env, writer, "training", [&] { summary = trainer->run(writer, progress, &job->control); }, &job->control);
  if (job->control.preempted) return kExitPreempted;
  log::info("done: {} epochs in {:.1f} s | test accuracy {:.2f} % | {:.1f} img/s (all ranks) | {} run {}",
            summary.epochs_completed, summary.total_s, 100 * summary.test_accuracy, summary.samples_per_s,
            writer.path(), writer.run_id());
  return 0;
}

}  // namespace mgbench::train
