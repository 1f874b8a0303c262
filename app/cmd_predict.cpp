// `mgbench predict`: time per epoch and per run, speed-up and the limiting phase of measured
// workloads at other rank counts and strategies (report/predict.h has the model), printed and
// appended to a results file as runs of task `prediction`. A single process; no GPU needed.
#include <iostream>

#include "commands.h"
#include "mpi_start.h"
#include "options.h"
#include "report/commands.h"

namespace mgbench::app {

int predict_main(int argc, char** argv) {
  return run_command<report::PredictOptions>(
      {"predict", report::PredictOptions::kUsage}, argc, argv, [&](const report::PredictOptions& o) {
        // The predictions are written as runs of a results file: MPI (a single process) for HDF5.
        const auto mpi = start_mpi("predict", argc, argv);
        return mpi ? report::run_predict(o, join_command_line(argc, argv), std::cout, std::cerr) : 1;
      });
}

}  // namespace mgbench::app
