// `mgbench image` and `mgbench llm`: the options of the task's recipe and of the training loop
// (one option table, train/job_config.h), parsed on every rank, then the job. No logic beyond
// parsing.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "commands.h"
#include "core/error.h"
#include "core/log.h"
#include "options.h"
#include "runtime/mpi_env.h"
#include "runtime/stop_request.h"
#include "train/job.h"
#include "train/job_config.h"

namespace mgbench::app {
namespace {

po::options_description general_options() {
  po::options_description general("General", kLineLength, kDescriptionLength);
  // clang-format off: one option per line
  general.add_options()("config", po::value<std::string>(),
                        "INI file of `option = value` lines; the command line overrides it")(
      "dry-run", "validate the configuration, print it and exit")("verbose", "log at debug level on every rank")(
      "help,h", "show this help");
  // clang-format on
  return general;
}

/// The recipe named on the command line or in the --config file; "" (the task's default) when none.
std::string chosen_recipe(int argc, char** argv) {
  po::options_description first;
  first.add_options()("recipe", po::value<std::string>())("config", po::value<std::string>());
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(first).allow_unregistered().run(), vm);
    if (vm.count("recipe") == 0 && vm.count("config") != 0) {
      // Only a regular file (a FIFO would block here): options.cpp names any other.
      std::error_code ec;
      const std::string path = vm["config"].as<std::string>();
      std::ifstream file;
      if (std::filesystem::is_regular_file(path, ec)) file.open(path);
      try {
        if (file.good() && file.is_open()) {
          po::store(po::parse_config_file(file, first, /*allow_unregistered=*/true), vm);
        }
      } catch (const po::error& e) {
        throw ConfigError(fmt::format("--config {}: {}", path, error_text(e)));
      }
    }
  } catch (const po::error& e) {
    throw ConfigError(error_text(e));
  }
  return vm.count("recipe") != 0 ? vm["recipe"].as<std::string>() : "";
}

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
  std::optional<runtime::MpiEnvironment> mpi;
  try {
    mpi.emplace(&argc, &argv);
  } catch (const CommError& e) {  // every rank alike (an MPI without thread support)
    std::cerr << "mgbench " << task << ": " << e.what() << "\n";
    return 1;
  }
  runtime::MpiEnvironment& env = *mpi;
  std::unique_ptr<train::JobConfig> config;
  po::variables_map vm;
  try {
    config = train::configure(task, chosen_recipe(argc, argv));
    po::options_description all(usage(task), kLineLength, kDescriptionLength);
    describe(config->table, all);
    all.add(general_options());
    parse(argc, argv, all, vm);
    if (vm.count("help") != 0) {
      if (env.rank() == 0) std::cout << all << "\n";
      return 0;
    }
    apply_values(vm, config->table);
    config->validate();
  } catch (const ConfigError& e) {
    // Every rank parses the same argv and fails alike: report once, exit cleanly.
    if (env.rank() == 0)
      std::cerr << "mgbench " << task << ": " << e.what() << "\n(see mgbench " << task << " --help)\n";
    return 2;
  } catch (const std::exception& e) {
    // A defect of mgbench's own option tables (an option declared twice, a default naming none).
    if (env.rank() == 0) std::cerr << "mgbench " << task << ": internal error in the options: " << e.what() << "\n";
    return 1;
  }
  log::init(env.rank(), env.world_size(), vm.count("verbose") != 0);
  const std::string hosts = env.all_hosts();  // collective
  if (env.rank() == 0) {
    std::cout << fmt::format("# mgbench {} ({} recipe): {} rank(s) on {}\n", task, config->recipe_name,
                             env.world_size(), hosts);
    std::cout << "# resolved configuration (also stored in the results file as the run's `config` attribute)\n";
    std::istringstream lines(config->ini());
    for (std::string line; std::getline(lines, line);) std::cout << "#   " << line << "\n";
    std::cout << std::flush;
  }
  if (vm.count("dry-run") != 0) return 0;
  return train::run_job(*config, env, join_command_line(argc, argv));
}

}  // namespace

int image_main(int argc, char** argv) { return train_command("image", argc, argv); }
int llm_main(int argc, char** argv) { return train_command("llm", argc, argv); }

}  // namespace mgbench::app
