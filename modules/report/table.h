#pragma once
// The report's tables as column descriptors: each column its header, unit, width and cell, and its
// CSV header and cell, so that the header row, the units row, the data rows and the CSV all come from
// one list. The table as nccl-tests prints its own: the header and units rows start with '#', data
// rows with two spaces (the columns line up, and `grep -v '^#'` leaves only data); the CSV: a header
// line, then a line per row. Internal to report/.
#include <cmath>
#include <cstdlib>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace mgbench::report {

/// v with `digits` decimals; "-" for NaN or infinity (not measured).
inline std::string number(double v, int digits) { return std::isfinite(v) ? fmt::format("{:.{}f}", v, digits) : "-"; }

/// v with the decimals its size needs in a 12-wide cell: 1 from 100 on, 3 from 1 on, else 5.
inline std::string scaled_number(double v) { return number(v, std::abs(v) >= 100 ? 1 : std::abs(v) >= 1 ? 3 : 5); }

/// text as one CSV field (RFC 4180): in double quotes, its quotes doubled, where it holds a comma, a
/// quote or a line break (a GPU model: "NVIDIA H200, 139.8 GiB, sm_90"); else as it is.
inline std::string csv_field(std::string_view text) {
  if (text.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(text);
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

template <typename Row>
struct Column {
  std::string_view header;                      // in the table's header row
  std::string_view unit;                        // in the table's units row: "(s)", "(%)", or ""
  int width = 0;                                // in the table (0: unpadded); negative: left-aligned. No header, unit
                                                // or width: a CSV-only column
  std::string_view csv;                         // the CSV header; "": a table-only column
  std::function<std::string(const Row&)> cell;  // the table's text (and the CSV's, unless csv_cell)
  std::function<std::string(const Row&)> csv_cell = {};  // the CSV's text where it differs (more digits, raw values)

  bool in_table() const { return !header.empty() || !unit.empty() || width != 0; }
};

/// Writes rows as the columns say: the table (header, units, data rows) or the CSV (header line,
/// data lines).
template <typename Row>
void write_table(std::ostream& out, const std::vector<Column<Row>>& columns, const std::vector<Row>& rows, bool csv) {
  if (csv) {
    std::string line;
    for (const auto& c : columns) {
      if (!c.csv.empty()) line += (line.empty() ? "" : ",") + std::string(c.csv);
    }
    out << line << "\n";
    for (const auto& row : rows) {
      line.clear();
      bool first = true;
      for (const auto& c : columns) {
        if (c.csv.empty()) continue;
        line += (first ? "" : ",") + csv_field(c.csv_cell ? c.csv_cell(row) : c.cell(row));
        first = false;
      }
      out << line << "\n";
    }
    return;
  }
  auto row_of = [&](const std::string& prefix, auto&& text) {
    std::string line = prefix;
    bool first = true;
    for (const auto& c : columns) {
      if (!c.in_table()) continue;
      const std::string value = text(c);
      line += (first ? "" : " ") +
              (c.width < 0 ? fmt::format("{:<{}}", value, -c.width) : fmt::format("{:>{}}", value, c.width));
      first = false;
    }
    out << line << "\n";
  };
  row_of("# ", [](const Column<Row>& c) { return std::string(c.header); });
  row_of("# ", [](const Column<Row>& c) { return std::string(c.unit); });
  for (const auto& row : rows) row_of("  ", [&](const Column<Row>& c) { return c.cell(row); });
}

}  // namespace mgbench::report
