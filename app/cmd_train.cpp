// `mgbench image` and `mgbench llm`: the options of the task's recipe and of the training loop
// (one option table, train/job_config.h), parsed on every rank, then the job.
#include <iostream>
#include <sstream>

#include <fmt/format.h>

#include "commands.h"
#include "core/error.h"
#include "core/log.h"
#include "mpi_start.h"
#include "options.h"
#include "runtime/mpi_env.h"
#include "runtime/stop_request.h"
#include "train/job.h"
#include "train/job_config.h"

namespace mgbench::app {
namespace {

std::string usage(const std::string& task) {
  std::string recipes;
  for (const auto& r : train::recipes()) {
    if (r.task == task) recipes += fmt::format(" {}", r.name);
  }
  return fmt::format(
      "mgbench {}: train a recipe ({}) across MPI ranks, one rank per GPU (or CPU slot); per-rank timings "
      "and metrics into an HDF5 results file.\nusage: mpirun -np N mgbench {} [--recipe NAME] [options]   "
      "(mgbench {} --recipe NAME --help: that recipe's options)\noptions",
      task, recipes.substr(1), task, task);
}

int train_command(const std::string& task, int argc, char** argv) {
  // First of all, before MPI_Init's slow start: a SIGUSR1 / SIGTERM arriving during set-up ends the
  // process with a message and exit 75 (nothing trained or written), not the default action.
  runtime::install_stop_handlers();
  const auto mpi = start_mpi(task, argc, argv);
  if (!mpi) return 1;
  runtime::MpiEnvironment& env = *mpi;
  const bool speak = env.rank() == 0;
  std::unique_ptr<train::JobConfig> config;
  try {
    config = train::configure(task, prescan(argc, argv, "recipe"));  // the recipe decides the options
  } catch (const ConfigError& e) {
    if (speak) std::cerr << "mgbench " << task << ": " << e.what() << "\n(see mgbench " << task << " --help)\n";
    return 2;
  } catch (const std::exception& e) {
    // A defect of mgbench's own option tables (an option declared twice, a default naming none).
    if (speak) std::cerr << "mgbench " << task << ": internal error in the options: " << e.what() << "\n";
    return 1;
  }
  GeneralFlags flags;
  const CommandSpec spec{task, usage(task), /*config_file=*/true, /*dry_run=*/true, /*verbose=*/true};
  if (auto exit_code = parse_command(
          spec, config->table, argc, argv, flags, [&] { config->validate(flags.dry_run); }, speak)) {
    return *exit_code;
  }
  log::init(env.rank(), env.world_size(), flags.verbose);
  const std::string hosts = env.all_hosts();  // collective
  if (speak) {
    std::cout << fmt::format("# mgbench {} ({} recipe): {} rank(s) on {}\n", task, config->recipe_name,
                             env.world_size(), hosts);
    std::cout << "# resolved configuration (also stored in the results file as the run's `config` attribute)\n";
    std::istringstream lines(config->ini());
    for (std::string line; std::getline(lines, line);) std::cout << "#   " << line << "\n";
    std::cout << std::flush;
  }
  if (flags.dry_run) {
    if (!speak) return 0;
    try {
      for (const std::string& line :
           train::format_memory_plan(config->recipe->memory_plan(config->train, flags.plan_ranks))) {
        std::cout << "# " << line << "\n";
      }
    } catch (const ConfigError& e) {
      std::cerr << "mgbench " << task << ": " << e.what() << "\n";
      return 2;
    } catch (const std::exception& e) {
      std::cerr << "mgbench " << task << ": " << error_message(e) << "\n";
      return 1;
    }
    return 0;
  }
  return train::run_job(*config, env, join_command_line(argc, argv));
}

}  // namespace

int image_main(int argc, char** argv) { return train_command("image", argc, argv); }
int llm_main(int argc, char** argv) { return train_command("llm", argc, argv); }

}  // namespace mgbench::app
