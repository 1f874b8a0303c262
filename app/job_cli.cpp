#include "job_cli.h"

#include <iostream>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"

namespace mgbench::app {

po::options_description job_general_options() {
  po::options_description general("General");
  // clang-format off: one option per line
  general.add_options()("config", po::value<std::string>(),
                        "INI file of `option = value` lines; the command line overrides it")(
      "dry-run", "validate the configuration, print it and exit")("verbose", "log at debug level on every rank")(
      "help,h", "show this help");
  // clang-format on
  return general;
}

po::options_description checkpoint_options(train::CheckpointOptions& o) {
  po::options_description group(
      "Checkpoints and preemption (SIGTERM / SIGUSR1: stop at the next step, checkpoint, exit 75)");
  // clang-format off: one option per line
  group.add_options()("checkpoint-dir", po::value(&o.dir)->default_value(o.dir),
                      "directory of checkpoints (one subdirectory per run configuration); empty: none")(
      "checkpoint-every", po::value(&o.every_steps)->default_value(o.every_steps),
      "optimizer steps between checkpoints (0: only when stopped by a signal and at the end)")(
      "resume", po::bool_switch(&o.resume),
      "continue the latest checkpoint of this configuration in --checkpoint-dir (its run, its results file); "
      "start a new run when there is none");
  // clang-format on
  return group;
}

std::optional<int> parse_job_options(const runtime::MpiEnvironment& env, const std::string& command, int argc,
                                     char** argv, const po::options_description& options, po::variables_map& vm,
                                     const std::function<void()>& finish) {
  try {
    parse(argc, argv, options, vm);
    if (vm.count("help") != 0) {
      if (env.rank() == 0) std::cout << options << "\n";
      return 0;
    }
    finish();
  } catch (const ConfigError& e) {
    // Every rank parses the same argv and fails alike: report once, exit cleanly.
    if (env.rank() == 0)
      std::cerr << "mgbench " << command << ": " << e.what() << "\n(see mgbench " << command << " --help)\n";
    return 2;
  }
  return std::nullopt;
}

std::string announce_job(const runtime::MpiEnvironment& env, const std::string& command, const po::variables_map& vm) {
  log::init(env.rank(), env.world_size(), vm.count("verbose") != 0);
  const std::string resolved = to_ini(vm, "dry-run,verbose");
  const std::string hosts = env.all_hosts();  // collective
  if (env.rank() == 0) {
    std::cout << fmt::format("# mgbench {}: {} rank(s) on {}\n", command, env.world_size(), hosts);
    std::cout << "# resolved configuration (also stored in the results file as the run's `config` attribute)\n";
    std::istringstream lines(resolved);
    for (std::string line; std::getline(lines, line);) std::cout << "#   " << line << "\n";
    std::cout << std::flush;
  }
  return resolved;
}

}  // namespace mgbench::app
