#include "train/model_shapes.h"

#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/ini_lines.h"
#include "train/job_config.h"

namespace mgbench::train {
namespace {

/// The value of option `name` in the lines; "" when absent.
std::string value_of(const std::vector<std::pair<std::string, std::string>>& lines, std::string_view name) {
  for (const auto& [key, value] : lines) {
    if (key == name) return value;
  }
  return {};
}

/// task's job as the lines configure it (each given, as on the command line), with --model `model`
/// where not empty, validated (what the run did not use set to its defaults: OptionTable::reset_unused).
std::unique_ptr<JobConfig> job_of(std::string_view task, const std::vector<std::pair<std::string, std::string>>& lines,
                                  const std::string& model) {
  std::unique_ptr<JobConfig> job = configure(task, value_of(lines, "recipe"));  // the recipe decides the options
  for (const auto& [name, value] : lines) {
    try {
      job->set(name, value);
    } catch (const std::out_of_range&) {
      throw ConfigError(fmt::format("the run's configuration has option '{}', which this mgbench does not know", name));
    }
  }
  if (!model.empty()) job->set("model", model);
  job->table.reset_unused();  // a run recorded before such settings were refused (they had no effect)
  job->validate();
  return job;
}

}  // namespace

ModelStepShapes model_step_shapes(std::string_view task, const std::string& config_ini, const std::string& model,
                                  double padded_tokens_per_sample, const std::vector<int>& ranks) {
  const auto lines = options::ini_lines(config_ini);  // as OptionTable::ini() wrote them
  ModelStepShapes out;
  out.base_model = value_of(lines, "model");
  const std::unique_ptr<JobConfig> base = job_of(task, lines, "");
  const std::unique_ptr<JobConfig> other = job_of(task, lines, model);
  std::optional<ModelStepShape> base_shape;
  try {
    base_shape = base->recipe->model_step_shape(base->train, padded_tokens_per_sample);
  } catch (const Error& e) {
    // A directory given relative to where the run started, or on another machine (not a preset either).
    throw DataError(
        fmt::format("the measured run's own model '{}' (its configuration's --model) must be readable "
                    "from here to compare the two: {}",
                    out.base_model, e.what()));
  }
  MGBENCH_REQUIRE(base_shape.has_value(), ConfigError,
                  "--model: recipe '{}' cannot price its step for another model (the LLM recipes can)",
                  base->recipe_name);
  out.base = *base_shape;
  out.model = *other->recipe->model_step_shape(other->train, padded_tokens_per_sample);
  out.model_plan = other->recipe->memory_plan(other->train, ranks);
  return out;
}

}  // namespace mgbench::train
