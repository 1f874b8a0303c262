// `mgbench comm`: the collective benchmark's options (comm/comm_benchmark.h), parsed on every rank,
// then the benchmark.
#include <iostream>
#include <optional>

#include "comm/comm_benchmark.h"
#include "commands.h"
#include "core/error.h"
#include "core/log.h"
#include "options.h"
#include "runtime/mpi_env.h"

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
  comm::CommOptions options;
  options::OptionTable table;
  options.declare(table);
  const CommandSpec spec{
      "comm",
      "mgbench comm: collective benchmark over the Communicator mgbench trains with (MPI on CPUs, NCCL on GPUs), in "
      "nccl-tests' manner and output.\nusage: mpirun -np N mgbench comm [--collective all-reduce,...] [--min-bytes 8] "
      "[--max-bytes 64M] [options]\noptions",
      /*config_file=*/true, /*dry_run=*/false, /*verbose=*/true};
  GeneralFlags flags;
  if (auto exit_code = parse_command(
          spec, table, argc, argv, flags, [&] { options.validate(); }, /*speak=*/env.rank() == 0)) {
    return *exit_code;
  }
  log::init(env.rank(), env.world_size(), flags.verbose);
  return comm::run_comm_benchmark(options, table, env, join_command_line(argc, argv));
}

}  // namespace mgbench::app
