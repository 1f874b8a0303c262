#pragma once
// `mgbench report` and `mgbench predict` as app/ calls them: their options (declared into the
// command's option table) and the whole command on the parsed options. No LibTorch: mgbench-report
// runs this on a login node.
#include <ostream>
#include <string>
#include <vector>

#include "core/option_table.h"
#include "report/predict.h"

namespace mgbench::report {

/// The options of `mgbench report`.
struct ReportOptions {
  /// --help's text above the options.
  static constexpr const char* kUsage =
      "mgbench report: one row per run (ranks, strategy, precision, pin_memory, image size, total time,\n"
      "test accuracy, efficiency vs 1 rank and vs FP64); LLM, DPO, comm runs and predictions in tables of their "
      "own.\nusage: mgbench report [--csv] [--phases] [--cuda] [--energy] [--paper] [--plot DIR] "
      "FILE|DIR|'PATTERN'...\n"
      "       mgbench report --reference REF [--tolerance PCT] [--csv] FILE|DIR|'PATTERN'...   (exit 0: every metric "
      "holds, 1: one regressed, 2: a run failed or was aborted, bad input or nothing to compare)\n"
      "  DIR: every *.h5 below it; PATTERN: a quoted shell glob (e.g. 'outputs/*/results.h5'), expanded here.";

  std::vector<std::string> files;  // results files, directories, quoted patterns (positional)
  bool csv = false;
  bool phases = false;
  bool cuda = false;
  bool energy = false;
  bool paper = false;
  std::string plot;                    // directory for the figures and index.html; "": none
  std::vector<std::string> reference;  // --reference: results files of the reference runs; empty: none
  double tolerance_pct = 10.0;         // --tolerance [%]

  void declare(options::OptionTable& table);
};

/// Reads the files and prints, in order: the image runs' table (Table 2; also when the files hold no
/// run of any kind), the LLM runs' (Table 5) with the DPO runs' beside it, the comm runs', the
/// spread of repeated workloads (report/repeats.h; where a workload ran more than once), the
/// predictions beside their measured runs, then with --phases the phase times, with --cuda the CUDA
/// metrics, with --energy the energy table, with --paper the papers' cells
/// (paper_table.h); with --plot the figures (figures.h). Returns the exit code: 0, or 1 with
/// the message on err for an unreadable file or failed figures. With --reference, only the comparison with the
/// reference runs (report/reference.h): exit 0 when every metric holds (or improved), 1 when one regressed or a run of
/// FILES failed, 2 for an unreadable file or when no run of FILES has a reference run of its workload.
int run_report(const ReportOptions& options, std::ostream& out, std::ostream& err);

/// Reads the files (and --comm's), predicts every workload, prints the plan and appends the
/// predictions to options.results (MPI must be initialised: a single process). Returns the exit
/// code: 0, or 1 with the message on err (unreadable files, no 1-rank run, a results file that
/// cannot be written).
int run_predict(const PredictOptions& options, const std::string& command_line, std::ostream& out, std::ostream& err,
                const ModelScaler& scaler = {});

}  // namespace mgbench::report
