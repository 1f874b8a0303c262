#include "train/job_config.h"

#include <fmt/format.h>

namespace mgbench::train {

void JobConfig::validate(bool dry_run) {
  recipe->resolve_defaults(table);
  table.validate(dry_run);
  train.validate();
  recipe->validate(train);
}

std::unique_ptr<JobConfig> configure(std::string_view task, std::string_view recipe) {
  const RecipeInfo& info = find_recipe(task, recipe);
  auto config = std::make_unique<JobConfig>();
  config->task = std::string(task);
  config->recipe_name = std::string(info.name);
  config->recipe = info.make();
  options::OptionTable& table = config->table;
  table.section("Recipe");
  std::string recipes;
  for (const auto& r : train::recipes()) {
    if (r.task == task) recipes += fmt::format("\n  {}: {}", r.name, r.help);
  }
  table.add("recipe", config->recipe_name, "what the job trains (chosen before the other options are read)" + recipes)
      .value_name("NAME")
      .check([chosen = config->recipe_name](const std::string& name) { return name == chosen; },
             fmt::format("{} (the recipe read first, from the command line or --config)", info.name));
  config->recipe->declare(table);
  config->train.declare(table);
  table.set_defaults(info.defaults);
  return config;
}

}  // namespace mgbench::train
