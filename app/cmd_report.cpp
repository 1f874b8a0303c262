// `mgbench report`: tables (and figures) from results files. Never initialises MPI and needs no
// LibTorch (mgbench-report is this command alone).
#include <iostream>

#include "commands.h"
#include "options.h"
#include "report/commands.h"

namespace mgbench::app {

int report_main(int argc, char** argv) {
  report::ReportOptions options;
  options::OptionTable table;
  options.declare(table);
  const CommandSpec spec{
      "report",
      "mgbench report: one row per run (ranks, strategy, precision, pin_memory, image size, total time,\n"
      "test accuracy, efficiency vs 1 rank and vs FP64); LLM, DPO, comm runs and predictions in tables of their "
      "own.\nusage: mgbench report [--csv] [--phases] [--cuda] [--plot DIR] FILE|DIR|'PATTERN'...\n"
      "  DIR: every *.h5 below it; PATTERN: a quoted shell glob (e.g. 'outputs/*/results.h5'), expanded here.\n"
      "options"};
  GeneralFlags flags;
  if (auto exit_code = parse_command(spec, table, argc, argv, flags)) return *exit_code;
  return report::run_report(options, std::cout, std::cerr);
}

}  // namespace mgbench::app
