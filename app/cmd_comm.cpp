// `mgbench comm`: the collective benchmark's options (train/comm_benchmark.h), parsed on every rank,
// then the benchmark. No logic beyond parsing.
#include <iostream>
#include <optional>

#include <fmt/format.h>

#include "commands.h"
#include "core/error.h"
#include "core/log.h"
#include "options.h"
#include "runtime/mpi_env.h"
#include "train/comm_benchmark.h"

namespace mgbench::app {

int comm_main(int argc, char** argv) {
  std::optional<runtime::MpiEnvironment> mpi;
  try {
    mpi.emplace(&argc, &argv);
  } catch (const CommError& e) {
    std::cerr << "mgbench comm: " << e.what() << "\n";
    return 1;
  }
  runtime::MpiEnvironment& env = *mpi;
  train::CommOptions options;
  options::OptionTable table;
  po::variables_map vm;
  try {
    options.declare(table);
    po::options_description all(
        "mgbench comm: collective benchmark over the Communicator mgbench trains with (MPI on CPUs, NCCL on GPUs), "
        "in nccl-tests' manner and output.\nusage: mpirun -np N mgbench comm [--collective all-reduce,...] "
        "[--min-bytes 8] [--max-bytes 64M] [options]\noptions",
        kLineLength, kDescriptionLength);
    describe(table, all);
    po::options_description general("General", kLineLength, kDescriptionLength);
    general.add_options()("config", po::value<std::string>(), "INI file of `option = value` lines")(
        "verbose", "log at debug level on every rank")("help,h", "show this help");
    all.add(general);
    parse(argc, argv, all, vm);
    if (vm.count("help") != 0) {
      if (env.rank() == 0) std::cout << all << "\n";
      return 0;
    }
    apply_values(vm, table);
    table.validate();
    options.validate();
  } catch (const ConfigError& e) {
    if (env.rank() == 0) std::cerr << "mgbench comm: " << e.what() << "\n(see mgbench comm --help)\n";
    return 2;
  }
  log::init(env.rank(), env.world_size(), vm.count("verbose") != 0);
  return train::run_comm_benchmark(options, table, env, join_command_line(argc, argv));
}

}  // namespace mgbench::app
