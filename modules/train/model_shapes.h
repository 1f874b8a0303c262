#pragma once
// `mgbench predict --model`: a measured run's job, rebuilt from its resolved configuration, and the
// same job with another model, as the shapes their recipe gives (Recipe::model_step_shape) -- what
// report::ModelScaling prices (docs/design.md, The scaling predictor). Reads no data, builds no model.
#include <string>
#include <string_view>
#include <vector>

#include "train/recipe.h"

namespace mgbench::train {

struct ModelStepShapes {
  std::string base_model;                 // the run's --model
  ModelStepShape base, model;             // of the run's model and of the other, with the run's options
  std::vector<MemoryPlanRow> model_plan;  // the other model's --dry-run plan at the ranks asked
};

/// The shapes of `task`'s job configured by `config_ini` (a run's `config` attribute: "name = value"
/// lines, --config's format) and of the same job with --model `model`, their FLOPs counted at
/// `padded_tokens_per_sample` (the run's padded tokens over its samples), the other model's memory
/// planned at `ranks`. Throws ConfigError naming the option: a configuration this mgbench cannot read
/// (an option it does not know, a value out of bounds), a recipe that cannot say its shapes (the
/// image recipes), an unknown preset; DataError naming config.json.
ModelStepShapes model_step_shapes(std::string_view task, const std::string& config_ini, const std::string& model,
                                  double padded_tokens_per_sample, const std::vector<int>& ranks);

}  // namespace mgbench::train
