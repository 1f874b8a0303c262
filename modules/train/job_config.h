#pragma once
// A job's whole configuration: the training loop's options (TrainOptions), the recipe with its
// own options, and the option table that binds both to their names (core/option_table.h). The
// command line (app/), a config file and the tests all fill it through the table, so every
// value is parsed once, at the boundary, into its typed field.
#include <memory>
#include <string>
#include <string_view>

#include "core/option_table.h"
#include "train/recipe.h"
#include "train/train_options.h"

namespace mgbench::train {

struct JobConfig {
  JobConfig() = default;
  JobConfig(const JobConfig&) = delete;  // the table refers into it
  JobConfig& operator=(const JobConfig&) = delete;

  std::string task;         // the command: image | llm
  std::string recipe_name;  // --recipe
  TrainOptions train;
  std::unique_ptr<Recipe> recipe;
  options::OptionTable table;

  /// Sets --name from text, as the command line would. Throws ConfigError for a bad value,
  /// std::out_of_range for an option the job does not have.
  void set(std::string_view name, const std::string& text) { table.set(name, text); }
  /// Completes the configuration once every value is read -- the recipe's defaults that depend on
  /// other options (Recipe::resolve_defaults) -- then checks every option's bounds, the loop's
  /// rules and the recipe's (dry_run: for --dry-run's plan, which needs no input: --data may be
  /// left out). Throws ConfigError naming the first invalid option and what it expects.
  void validate(bool dry_run = false);
  /// The resolved configuration as INI text ("name = value" lines), readable with --config.
  std::string ini() const { return table.ini(); }
  /// The settings that change results: the checkpoint identity (checkpointer.h).
  std::string identity() const { return table.identity(); }
};

/// The configuration of task's recipe `recipe` (the task's default recipe when empty), every
/// option at its default (the recipe's defaults of the loop's options). Throws ConfigError naming
/// --recipe for a recipe the task does not have.
std::unique_ptr<JobConfig> configure(std::string_view task, std::string_view recipe = "");

}  // namespace mgbench::train
