// `mgbench predict`: time per epoch and per run, speed-up and the limiting phase of measured
// workloads at other rank counts and strategies (report/predict.h has the model), printed and
// appended to a results file as runs of task `prediction`. A single process; no GPU needed. With
// --model, an LLM run's step is priced for another model: its shapes come from the run's recipe
// (train/model_shapes.h), which the LibTorch-free report module cannot build.
#include <cmath>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "mpi_start.h"
#include "options.h"
#include "report/commands.h"
#include "train/model_shapes.h"

namespace mgbench::app {
namespace {

/// --model's ModelScaling of a measured LLM run: its job and the same with `model`, as shapes.
report::ModelScaling model_scaling(const results::RunRecord& base, const std::string& model,
                                   const std::vector<std::int64_t>& ranks) {
  const std::string task = base.display("task");
  MGBENCH_REQUIRE(task == "llm", ConfigError, "--model {}: run {} ({}) is `mgbench {}`, not an LLM run", model,
                  base.run_id, base.file, task);
  const std::optional<std::string> config = base.text("config");
  MGBENCH_REQUIRE(config.has_value(), ResultsError, "run {} ({}) does not record its configuration (`config`)",
                  base.run_id, base.file);
  // The run's padded tokens a sample: both rates are over its train_s.
  const double tokens_per_sample = base.summary.padded_tokens_per_s / base.summary.samples_per_s;
  MGBENCH_REQUIRE(std::isfinite(tokens_per_sample) && tokens_per_sample > 0, ResultsError,
                  "run {} ({}) records no padded tokens a sample (padded_tokens_per_s / samples_per_s)", base.run_id,
                  base.file);
  std::vector<int> worlds;
  for (const std::int64_t n : ranks) worlds.push_back(static_cast<int>(n));
  const train::ModelStepShapes shapes = train::model_step_shapes(task, *config, model, tokens_per_sample, worlds);
  report::ModelScaling s;
  s.model = model;
  s.base_model = shapes.base_model;
  s.compute_factor = shapes.model.flops_per_position / shapes.base.flops_per_position;
  s.optimizer_factor = shapes.base.trainable_parameters > 0 ? static_cast<double>(shapes.model.trainable_parameters) /
                                                                  static_cast<double>(shapes.base.trainable_parameters)
                                                            : 1.0;
  s.padded_tokens_per_sample = tokens_per_sample;
  s.allgather_bytes.assign(shapes.model.allgather_bytes.begin(), shapes.model.allgather_bytes.end());
  s.reducescatter_bytes.assign(shapes.model.reducescatter_bytes.begin(), shapes.model.reducescatter_bytes.end());
  for (const auto& row : shapes.model_plan) {
    s.memory_bytes_per_rank.emplace_back(row.world_size, static_cast<double>(row.total_bytes()));
  }
  return s;
}

}  // namespace

int predict_main(int argc, char** argv) {
  return run_command<report::PredictOptions>(
      {"predict", report::PredictOptions::kUsage}, argc, argv, [&](const report::PredictOptions& o) {
        // The predictions are written as runs of a results file: MPI (a single process) for HDF5.
        const auto mpi = start_mpi("predict", argc, argv);
        return mpi ? report::run_predict(o, join_command_line(argc, argv), std::cout, std::cerr, model_scaling) : 1;
      });
}

}  // namespace mgbench::app
