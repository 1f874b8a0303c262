#pragma once
// Repeats: the spread of a workload run several times (the same comparison group: workload
// identity, ranks, nodes, strategy, backend; report/reference.h), metric by metric -- the median,
// min, max and coefficient of variation a centre quotes instead of one sample.
#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

#include "results/reader.h"

namespace mgbench::report {

/// One metric of one repeated workload.
struct RepeatRow {
  std::string run;       // the latest run of the group
  std::string workload;  // short_workload()
  std::int64_t ranks = 0;
  std::string hardware;  // hardware_cell()
  std::string metric;    // run_metrics()'s names
  std::size_t runs = 0;  // completed runs with this metric
  double median = 0, min = 0, max = 0;
  double cv = 0;  // coefficient of variation: sample standard deviation / mean (a fraction)
};

/// The groups of two or more completed, measured (not predicted) runs among `runs`, in the order their first run
/// appears; per group the metrics of its latest run.
std::vector<RepeatRow> repeat_rows(const std::vector<results::RunRecord>& runs);

/// The rows as a table ('#' metadata, header and units rows, data rows) or CSV.
void print_repeats(std::ostream& out, const std::vector<RepeatRow>& rows, bool csv);

}  // namespace mgbench::report
