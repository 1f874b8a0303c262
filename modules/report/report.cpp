// `mgbench report`'s table of image runs (the paper's Table 2) with the efficiencies that pair each
// run with its baselines, and what the tables ask of a run (completed, LLM, DPO, comm). The other
// tables: llm_tables.cpp, comm_table.cpp, breakdowns.cpp (--phases, --cuda).
#include "report/report.h"

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "report/reference.h"
#include "report/run_cells.h"
#include "report/table.h"
#include "report/workload.h"

namespace mgbench::report {

std::vector<Row> build_rows(const std::vector<results::RunRecord>& runs) {
  std::vector<std::string> identities;  // each run's, once
  for (const auto& run : runs) identities.push_back(workload_identity(run));
  std::vector<Row> rows;
  for (const auto& run : runs) {
    Row row{&run, std::nullopt, std::nullopt, {}};
    if (is_completed(run)) {
      const std::string& identity = identities[static_cast<std::size_t>(&run - runs.data())];
      const std::string fp64_identity = workload_identity(run, {{"precision", "fp64"}});
      // The 1-rank runs' times (the same strategy's where there are some) and the fp64 runs'.
      std::vector<double> one_rank_s, same_strategy_s, fp64_s;
      for (const auto& other : runs) {
        if (!is_completed(other)) continue;
        const std::string& other_identity = identities[static_cast<std::size_t>(&other - runs.data())];
        const bool same_strategy = other.display("strategy") == run.display("strategy");
        if (other.integer("world_size") == 1 && other_identity == identity) {
          (same_strategy ? same_strategy_s : one_rank_s).push_back(other.summary.total_s);
        }
        if (other_identity == fp64_identity && same_strategy &&
            other.integer("world_size") == run.integer("world_size")) {
          fp64_s.push_back(other.summary.total_s);
        }
      }
      if (!same_strategy_s.empty()) one_rank_s = std::move(same_strategy_s);
      if (!one_rank_s.empty()) row.efficiency_vs_1_rank = median(one_rank_s) / run.summary.total_s;
      if (!fp64_s.empty() && run.display("precision") != "fp64") {
        row.efficiency_vs_fp64 = median(fp64_s) / run.summary.total_s;
      }
      row.baseline_note = baseline_note(run, runs);
    }
    rows.push_back(row);
  }
  return rows;
}

AllReduceTimes all_reduce_times(const results::RunRecord& run) {
  AllReduceTimes t;
  for (const auto& rank : run.epochs) {
    for (const auto& e : rank) {
      if (std::isfinite(e.allreduce_window_s)) t.window_s += e.allreduce_window_s;
      t.exposed_s += e.phases.allreduce_s;
    }
  }
  return t;
}

bool is_completed(const results::RunRecord& run) {
  return run.status == "completed" && std::isfinite(run.summary.total_s);
}

bool is_llm_run(const results::RunRecord& run) { return run.display("task").rfind("llm", 0) == 0; }

bool is_comm_run(const results::RunRecord& run) { return run.display("task") == "comm"; }

std::string recipe_of(const results::RunRecord& r) {
  const std::string recipe = r.display("recipe");
  return !recipe.empty() ? recipe : is_llm_run(r) ? "lora" : "classification";
}

bool is_dpo_run(const results::RunRecord& run) { return is_llm_run(run) && recipe_of(run) == "dpo"; }

void print(std::ostream& out, const std::vector<Row>& rows, Format format) {
  auto attribute = [](const char* name) { return [name](const Row& w) { return w.run->display(name); }; };
  const std::vector<Column<Row>> columns = {
      {"", "", 0, "file", [](const Row& w) { return w.run->file; }},
      {"run", "", -36, "run_id", [](const Row& w) { return w.run->run_id; }},
      {"status", "", -9, "status", [](const Row& w) { return w.run->status; }},
      {"ranks", "", 5, "ranks", attribute("world_size")},
      {"nodes", "", 5, "nodes", attribute("nodes")},
      {"device", "", -14, "device", [](const Row& w) { return hardware_cell(*w.run); }, attribute("device")},
      {"", "", 0, "gpu_model", attribute("gpu_model")},
      {"", "", 0, "nccl_transports", [](const Row& w) { return w.run->summary.transports(); }},
      {"strat", "", -7, "strategy", attribute("strategy")},
      {"precision", "", -9, "precision", attribute("precision")},
      {"pin", "", -5, "pin_memory", attribute("pin_memory")},
      {"size", "(px)", 5, "image_size", attribute("image_size")},
      {"epochs", "", 6, "epochs", attribute("epochs")},
      {"", "", 0, "batch_size", attribute("batch_size")},
      {"total", "(s)", 10, "total_s", [](const Row& w) { return number(w.run->summary.total_s, 1); },
       [](const Row& w) { return number(w.run->summary.total_s, 3); }},
      {"test_acc", "(%)", 8, "test_accuracy_pct",
       [](const Row& w) { return number(w.run->summary.test_accuracy * 100.0, 2); }},
      {"thruput", "(img/s)", 9, "img_per_s", [](const Row& w) { return number(w.run->summary.samples_per_s, 1); }},
      {"eff_1rank", "(%)", 9, "efficiency_vs_1_rank_pct", [](const Row& w) { return percent(w.efficiency_vs_1_rank); }},
      {"eff_fp64", "(%)", 9, "efficiency_vs_fp64_pct", [](const Row& w) { return percent(w.efficiency_vs_fp64); }},
      {"", "", 0, "resumes", [](const Row& w) { return std::to_string(resumes(*w.run)); }},
  };
  const bool csv = format == Format::kCsv;
  if (!csv) {
    out << fmt::format("# mgbench report: {} run(s)\n", rows.size());
    out << "# efficiency vs 1 rank = T(1 rank) / T(n ranks); vs FP64 = T(fp64) / T(precision), same ranks "
           "(Lawenda et al. 2025, Table 2)\n";
  }
  write_table(out, columns, rows, csv);
  if (!csv) {
    for (const auto& row : rows) {
      print_notes(out, *row.run);
      if (!row.baseline_note.empty()) out << "# " << row.baseline_note << "\n";
    }
  }
}

}  // namespace mgbench::report
