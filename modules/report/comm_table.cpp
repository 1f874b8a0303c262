// `mgbench report`'s table of `mgbench comm` runs, in nccl-tests' columns: each collective, dtype,
// placement and size with its time min / avg / max across ranks, algbw and busbw.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "report/report.h"
#include "report/run_cells.h"
#include "report/table.h"

namespace mgbench::report {

/// One row of a comm run: a collective, dtype, placement and size, across ranks.
double CommRow::algbw_gbs() const { return static_cast<double>(first->bytes) / avg_s / 1e9; }

double CommRow::busbw_gbs() const {
  return first->time_s > 0 ? algbw_gbs() * first->busbw_gbs / first->algbw_gbs : results::kNaN;  // the bus factor
}

std::vector<CommRow> comm_rows(const results::RunRecord& run) {
  std::vector<CommRow> rows;
  if (run.comm.empty()) return rows;
  for (std::size_t i = 0; i < run.comm.front().size(); ++i) {
    CommRow row;
    row.first = &run.comm.front()[i];
    std::size_t ranks = 0;
    for (const auto& rank : run.comm) {
      if (i >= rank.size()) continue;
      const auto& c = rank[i];
      row.min_s = std::min(row.min_s, c.time_s);
      row.max_s = std::max(row.max_s, c.time_s);
      row.avg_s += c.time_s;
      if (c.wrong < 0) row.checked = false;
      row.wrong += std::max<std::int64_t>(c.wrong, 0);
      ++ranks;
    }
    row.avg_s /= static_cast<double>(std::max<std::size_t>(ranks, 1));
    rows.push_back(row);
  }
  return rows;
}

void print_comm(std::ostream& out, const std::vector<results::RunRecord>& runs, Format format) {
  struct CommLine {
    const results::RunRecord* run;
    CommRow row;
    double algbw, busbw;  // GB/s, from the average time
  };
  std::vector<CommLine> lines;
  for (const auto& r : runs) {
    if (!is_comm_run(r)) continue;
    for (const CommRow& row : comm_rows(r)) {
      lines.push_back({&r, row, row.algbw_gbs(), row.busbw_gbs()});
    }
  }
  using L = CommLine;
  auto attribute = [](const char* name) { return [name](const L& l) { return l.run->display(name); }; };
  auto record = [](const L& l) -> const results::CommRecord& { return *l.row.first; };
  auto micro = [](double CommRow::*field) { return [field](const L& l) { return number(l.row.*field * 1e6, 2); }; };
  // CSV: 9 significant digits, as the times (a small message's GB/s at 4 decimals read 0.0004 or 0).
  auto significant = [](double v) { return std::isfinite(v) ? fmt::format("{:.9g}", v) : std::string("-"); };
  auto seconds = [&](double CommRow::*field) { return [&, field](const L& l) { return significant(l.row.*field); }; };
  const std::vector<Column<L>> columns = {
      {"", "", 0, "file", [](const L& l) { return l.run->file; }},
      {"run", "", -28, "run_id", [](const L& l) { return l.run->run_id; }},
      {"", "", 0, "status", [](const L& l) { return l.run->status; }},
      {"ranks", "", 5, "ranks", attribute("world_size")},
      {"bknd", "", -5, "backend", attribute("backend")},
      {"", "", 0, "device", attribute("device")},
      {"collective", "", -15, "collective", [&](const L& l) { return std::string(record(l).collective); }},
      {"type", "", -5, "dtype", [&](const L& l) { return std::string(record(l).dtype); }},
      {"redop", "", -5, "op", [&](const L& l) { return std::string(record(l).op[0] != '\0' ? record(l).op : "none"); },
       [&](const L& l) { return std::string(record(l).op); }},
      {"", "", 0, "root", [&](const L& l) { return std::to_string(record(l).root); }},
      {"place", "", -6, "in_place", [&](const L& l) { return std::string(record(l).in_place != 0 ? "in" : "out"); },
       [&](const L& l) { return std::to_string(static_cast<int>(record(l).in_place)); }},
      {"size", "(B)", 12, "bytes", [&](const L& l) { return std::to_string(record(l).bytes); }},
      {"", "", 0, "count", [&](const L& l) { return std::to_string(record(l).count); }},
      {"time_min", "(us)", 10, "time_min_s", micro(&CommRow::min_s), seconds(&CommRow::min_s)},
      {"time_avg", "(us)", 10, "time_avg_s", micro(&CommRow::avg_s), seconds(&CommRow::avg_s)},
      {"time_max", "(us)", 10, "time_max_s", micro(&CommRow::max_s), seconds(&CommRow::max_s)},
      {"algbw", "(GB/s)", 8, "algbw_gbs", [](const L& l) { return number(l.algbw, 3); },
       [&](const L& l) { return significant(l.algbw); }},
      {"busbw", "(GB/s)", 8, "busbw_gbs", [](const L& l) { return number(l.busbw, 3); },
       [&](const L& l) { return significant(l.busbw); }},
      {"#wrong", "", 6, "wrong", [](const L& l) { return l.row.checked ? std::to_string(l.row.wrong) : "N/A"; },
       [](const L& l) { return l.row.checked ? std::to_string(l.row.wrong) : ""; }},
  };
  const bool csv = format == Format::kCsv;
  if (!csv) {
    out << "# comm runs (mgbench comm, nccl-tests' columns): time of one launch, min / avg / max across ranks; "
           "algbw = size / avg time, busbw = algbw x bus factor\n";
  }
  write_table(out, columns, lines, csv);
  if (!csv) {
    for (const auto& r : runs) {
      if (is_comm_run(r)) print_notes(out, r);
    }
  }
}

}  // namespace mgbench::report
