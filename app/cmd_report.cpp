// `mgbench report`: tables (and figures) from results files (report/commands.h). Never initialises
// MPI and needs no LibTorch (mgbench-report is this command alone).
#include <iostream>

#include "commands.h"
#include "options.h"
#include "report/commands.h"

namespace mgbench::app {

int report_main(int argc, char** argv) {
  return run_command<report::ReportOptions>(
      {"report", report::ReportOptions::kUsage}, argc, argv,
      [](const report::ReportOptions& o) { return report::run_report(o, std::cout, std::cerr); });
}

}  // namespace mgbench::app
