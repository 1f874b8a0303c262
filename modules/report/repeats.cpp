#include "report/repeats.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "report/predict.h"
#include "report/reference.h"
#include "report/report.h"
#include "report/table.h"
#include "report/workload.h"

namespace mgbench::report {

std::vector<RepeatRow> repeat_rows(const std::vector<results::RunRecord>& runs) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<const results::RunRecord*>> groups;
  for (const auto& r : runs) {
    if (!is_completed(r) || is_prediction_run(r)) continue;  // a prediction repeats nothing measured
    const std::string group = comparison_group(r);
    if (!groups.contains(group)) order.push_back(group);
    groups[group].push_back(&r);
  }
  std::vector<RepeatRow> rows;
  for (const auto& group : order) {
    const auto& members = groups[group];
    if (members.size() < 2) continue;
    const results::RunRecord& latest = *members.back();
    for (const RunMetric& m : run_metrics(latest)) {
      std::vector<double> values;
      for (const auto* r : members) {
        for (const auto& x : run_metrics(*r)) {
          if (x.metric == m.metric) values.push_back(x.value);
        }
      }
      if (values.size() < 2) continue;
      RepeatRow row;
      row.run = latest.run_id;
      row.workload = short_workload(latest);
      row.ranks = latest.integer("world_size").value_or(0);
      row.hardware = hardware_cell(latest);
      row.metric = m.metric;
      row.runs = values.size();
      row.median = median(values);
      row.min = *std::min_element(values.begin(), values.end());
      row.max = *std::max_element(values.begin(), values.end());
      double mean = 0;
      for (double v : values) mean += v;
      mean /= static_cast<double>(values.size());
      double squares = 0;
      for (double v : values) squares += (v - mean) * (v - mean);
      row.cv = std::sqrt(squares / static_cast<double>(values.size() - 1)) / mean;
      rows.push_back(row);
    }
  }
  return rows;
}

void print_repeats(std::ostream& out, const std::vector<RepeatRow>& rows, bool csv) {
  using R = RepeatRow;
  const std::vector<Column<R>> columns = {
      {"run", "(latest)", -28, "run_id", [](const R& r) { return r.run; }},
      {"workload", "", -18, "workload", [](const R& r) { return r.workload; }},
      {"ranks", "", 5, "ranks", [](const R& r) { return std::to_string(r.ranks); }},
      {"device", "", -14, "device", [](const R& r) { return r.hardware; }},
      {"metric", "", -36, "metric", [](const R& r) { return r.metric; }},
      {"runs", "", 4, "runs", [](const R& r) { return std::to_string(r.runs); }},
      {"median", "", 12, "median", [](const R& r) { return scaled_number(r.median); },
       [](const R& r) { return number(r.median, 6); }},
      {"min", "", 12, "min", [](const R& r) { return scaled_number(r.min); },
       [](const R& r) { return number(r.min, 6); }},
      {"max", "", 12, "max", [](const R& r) { return scaled_number(r.max); },
       [](const R& r) { return number(r.max, 6); }},
      {"cv", "(%)", 7, "cv_pct", [](const R& r) { return number(r.cv * 100.0, 2); },
       [](const R& r) { return number(r.cv * 100.0, 4); }},
  };
  if (!csv) {
    out << "# Repeats: workloads with several completed runs (same identity, ranks, nodes, strategy, backend); "
           "median, min, max and cv = sample standard deviation / mean over the runs\n";
  }
  write_table(out, columns, rows, csv);
}

}  // namespace mgbench::report
