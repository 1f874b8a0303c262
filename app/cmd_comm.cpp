// `mgbench comm`: the collective benchmark's options (comm/comm_benchmark.h), parsed on every rank,
// then the benchmark.
#include "comm/comm_benchmark.h"
#include "commands.h"
#include "core/log.h"
#include "mpi_start.h"
#include "options.h"
#include "runtime/mpi_env.h"

namespace mgbench::app {

int comm_main(int argc, char** argv) {
  const auto mpi = start_mpi("comm", argc, argv);
  if (!mpi) return 1;
  runtime::MpiEnvironment& env = *mpi;
  comm::CommOptions options;
  options::OptionTable table;
  if (!declare_options(
          "comm", [&] { options.declare(table); }, env.rank() == 0))
    return 1;
  const CommandSpec spec{"comm", comm::CommOptions::kUsage, /*config_file=*/true, /*dry_run=*/false,
                         /*verbose=*/true};
  GeneralFlags flags;
  if (auto exit_code = parse_command(
          spec, table, argc, argv, flags, [&] { options.validate(); }, /*speak=*/env.rank() == 0)) {
    return *exit_code;
  }
  log::init(env.rank(), env.world_size(), flags.verbose);
  return comm::run_comm_benchmark(options, table, env, join_command_line(argc, argv));
}

}  // namespace mgbench::app
