#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "report/predict.h"
#include "report/reference.h"
#include "report/report.h"
#include "report/table.h"
#include "report/workload.h"

namespace mgbench::report {

void print_prediction_check(std::ostream& out, const std::vector<results::RunRecord>& runs, bool csv) {
  // Each prediction beside the completed measured run of its workload, strategy and rank count
  // (repeats: the run of median time, as predict's base).
  struct Check {
    const results::RunRecord* prediction;
    const results::RunRecord* measured;  // nullptr: not measured
    double error_pct;                    // (predicted - measured) / measured
  };
  std::vector<Check> checks;
  for (const auto& p : runs) {
    if (!is_prediction_run(p)) continue;
    std::vector<const results::RunRecord*> repeats;
    for (const auto& m : runs) {
      if (is_prediction_run(m) || m.display("task") == "comm" || !is_completed(m)) continue;
      if (workload_identity(m) == workload_identity(p, {{"task", p.display("predicted_task")}}) &&
          m.display("strategy") == p.display("strategy") && m.integer("world_size") == p.integer("world_size") &&
          m.integer("nodes").value_or(1) == p.integer("nodes").value_or(1)) {
        repeats.push_back(&m);
      }
    }
    const results::RunRecord* measured = median_run(repeats);
    const double error =
        measured != nullptr ? 100.0 * (p.summary.total_s - measured->summary.total_s) / measured->summary.total_s : NAN;
    checks.push_back({&p, measured, error});
  }
  using C = Check;
  auto attribute = [](const char* name) { return [name](const C& c) { return c.prediction->display(name); }; };
  const std::vector<Column<C>> columns = {
      {"", "", 0, "file", [](const C& c) { return c.prediction->file; }},
      {"prediction", "", -36, "run_id", [](const C& c) { return c.prediction->run_id; }},
      {"ranks", "", 5, "ranks", attribute("world_size")},
      {"nodes", "", 5, "nodes", [](const C& c) { return std::to_string(c.prediction->integer("nodes").value_or(1)); }},
      {"strat", "", -7, "strategy", attribute("strategy")},
      {"precision", "", -9, "precision", attribute("precision")},
      {"size", "(px)", 5, "image_size", attribute("image_size")},
      {"predicted", "(s)", 10, "predicted_total_s", [](const C& c) { return number(c.prediction->summary.total_s, 2); },
       [](const C& c) { return fmt::format("{:.6g}", c.prediction->summary.total_s); }},
      {"measured run", "", -28, "measured_run_id",
       [](const C& c) { return c.measured != nullptr ? c.measured->run_id : "(not measured)"; },
       [](const C& c) { return c.measured != nullptr ? c.measured->run_id : ""; }},
      {"measured", "(s)", 10, "measured_total_s",
       [](const C& c) { return c.measured != nullptr ? number(c.measured->summary.total_s, 2) : "-"; },
       [](const C& c) { return c.measured != nullptr ? number(c.measured->summary.total_s, 3) : "-"; }},
      {"error", "(%)", 8, "error_pct", [](const C& c) { return number(c.error_pct, 1); },
       [](const C& c) { return number(c.error_pct, 2); }},
  };
  if (!csv) {
    out << "# PREDICTIONS (mgbench predict) beside the measured run of the same workload, strategy, rank and node "
           "count; "
           "error = (predicted - measured) / measured\n";
  }
  write_table(out, columns, checks, csv);
}

}  // namespace mgbench::report
