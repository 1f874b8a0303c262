// `mgbench predict`: time per epoch and per run, speed-up and the limiting phase of measured
// workloads at other rank counts and strategies (report/predict.h has the model), printed and
// appended to a results file as runs of task `prediction`. A single process; no GPU needed.
#include <iostream>
#include <optional>

#include "commands.h"
#include "core/error.h"
#include "options.h"
#include "report/commands.h"
#include "runtime/mpi_env.h"

namespace mgbench::app {

int predict_main(int argc, char** argv) {
  report::PredictOptions options;
  options::OptionTable table;
  options.declare(table);
  const CommandSpec spec{
      "predict",
      "mgbench predict: time per epoch and per run, speed-up and the limiting phase of measured workloads at other "
      "rank counts and strategies, from each workload's completed 1-rank run and the all-reduce of a `mgbench comm` "
      "run at each rank count (model: docs/design.md, The scaling predictor). Prints the predictions and appends "
      "them to --results as runs of task `prediction`; `mgbench report` then shows each beside its measured run.\n"
      "usage: mgbench predict FILE|DIR|'PATTERN'... [--comm FILE]... [--ranks 1,2,4] [--link h100-nvlink]\noptions"};
  GeneralFlags flags;
  if (auto exit_code = parse_command(spec, table, argc, argv, flags)) return *exit_code;
  // The predictions are written as runs of a results file: MPI (a single process) for HDF5.
  std::optional<runtime::MpiEnvironment> mpi;
  try {
    mpi.emplace(&argc, &argv);
  } catch (const CommError& e) {
    std::cerr << "mgbench predict: " << e.what() << "\n";
    return 1;
  }
  return report::run_predict(options, join_command_line(argc, argv), std::cout, std::cerr);
}

}  // namespace mgbench::app
