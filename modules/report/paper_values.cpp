// The papers' cells that `mgbench report --paper` compares with: python/mgbench_analysis/paper_values.csv as
// built into the binary (cmake/EmbedText.cmake), read with libcsv and checked field by field, and
// the metrics mgbench can put beside them.
#include <csv.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "report/paper_table.h"
#include "report/paper_values.h"  // generated from python/mgbench_analysis/paper_values.csv (cmake/EmbedText.cmake)

namespace mgbench::report {
namespace {

/// The metrics a cell may name and how mgbench obtains each (paper_table.h, PaperQuantity).
constexpr PaperMetric kMetrics[] = {
    {"total_time_20_epochs_s", PaperQuantity::kTotalTime, PaperBaseline::kNone, "s"},
    {"total_time_s", PaperQuantity::kTotalTime, PaperBaseline::kNone, "s"},
    {"test_accuracy_pct", PaperQuantity::kTestAccuracy, PaperBaseline::kNone, "%"},
    {"s_per_it", PaperQuantity::kSPerIt, PaperBaseline::kNone, "s/it"},
    {"efficiency_vs_1_gpu_pct", PaperQuantity::kTimeRatio, PaperBaseline::kOneGpu, "%"},
    {"efficiency_vs_fp64_pct", PaperQuantity::kTimeRatio, PaperBaseline::kFp64, "%"},
    {"efficiency_vs_pin_false_pct", PaperQuantity::kTimeRatio, PaperBaseline::kPinFalse, "%"},
    {"relative_improvement_pct", PaperQuantity::kTimeImprovement, PaperBaseline::kPinFalse, "%"},
};

/// The columns of paper_values.csv, in the file's order (any order is read).
constexpr std::array<std::string_view, 22> kColumns = {
    "paper",         "table",      "source",     "line",  "as_printed",       "task",    "gpus",  "strategy",
    "precision",     "pin_memory", "image_size", "model", "recipe",           "dataset", "batch", "epochs",
    "train_samples", "metric",     "value",      "unit",  "not_reproducible", "note"};

/// libcsv's callbacks (C: they must not throw) collect the rows as they complete, each with the CSV
/// line it ends on.
struct CsvRows {
  std::vector<std::vector<std::string>> rows;  // the header first
  std::vector<std::size_t> lines;
  std::vector<std::string> current;
  std::size_t line = 0;
};

void on_field(void* s, std::size_t len, void* data) {
  auto* rows = static_cast<CsvRows*>(data);
  rows->current.emplace_back(s != nullptr ? static_cast<const char*>(s) : "", s != nullptr ? len : 0);
}

void on_row(int, void* data) {
  auto* rows = static_cast<CsvRows*>(data);
  std::vector<std::string> fields = std::move(rows->current);
  rows->current.clear();
  if (fields.size() == 1 && fields[0].empty()) return;  // a blank line
  rows->rows.push_back(std::move(fields));
  rows->lines.push_back(rows->line);
}

/// The rows of an RFC 4180 text, fed to libcsv line by line so that each row knows its line.
CsvRows csv_rows(std::string_view text, std::string_view name) {
  csv_parser parser{};
  MGBENCH_REQUIRE(csv_init(&parser, CSV_STRICT | CSV_STRICT_FINI | CSV_APPEND_NULL) == 0, DataError,
                  "paper values '{}': CSV parser init failed", name);
  std::unique_ptr<csv_parser, void (*)(csv_parser*)> freer(&parser, csv_free);
  CsvRows rows;
  while (!text.empty()) {
    const std::size_t end = std::min(text.find('\n'), text.size() - 1);
    const std::string_view piece = text.substr(0, end + 1);
    text.remove_prefix(piece.size());
    ++rows.line;
    if (csv_parse(&parser, piece.data(), piece.size(), on_field, on_row, &rows) != piece.size()) {
      throw DataError(fmt::format("paper values '{}' line {}: malformed CSV ({})", name, rows.line,
                                  csv_strerror(csv_error(&parser))));
    }
  }
  if (csv_fini(&parser, on_field, on_row, &rows) != 0) {
    throw DataError(fmt::format("paper values '{}': malformed CSV at the end ({}: an unterminated quote?)", name,
                                csv_strerror(csv_error(&parser))));
  }
  return rows;
}

/// One row's fields by column name, converted with errors that say where.
class Fields {
 public:
  Fields(std::string_view name, std::size_t line, const std::map<std::string, std::size_t, std::less<>>& columns,
         const std::vector<std::string>& fields)
      : name_(name), line_(line), columns_(columns), fields_(fields) {}

  const std::string& text(std::string_view column) const { return fields_.at(columns_.find(column)->second); }

  /// A whole number >= 0; "" reads 0 (not stated).
  std::int64_t count(std::string_view column) const {
    const std::string& v = text(column);
    if (v.empty()) return 0;
    std::int64_t n = 0;
    const auto [end, error] = std::from_chars(v.data(), v.data() + v.size(), n);
    require(error == std::errc() && end == v.data() + v.size() && n >= 0, column, "a whole number >= 0");
    return n;
  }

  double real(std::string_view column) const {
    const std::string& v = text(column);
    double x = 0;
    const auto [end, error] = std::from_chars(v.data(), v.data() + v.size(), x);
    require(!v.empty() && error == std::errc() && end == v.data() + v.size() && std::isfinite(x), column, "a number");
    return x;
  }

  /// Throws DataError naming the text, line, column and value when `ok` is false.
  void require(bool ok, std::string_view column, std::string_view expected) const {
    MGBENCH_REQUIRE(ok, DataError, "paper values '{}' line {}: column {}: '{}', expected {}", name_, line_, column,
                    text(column), expected);
  }

 private:
  std::string_view name_;
  std::size_t line_;
  const std::map<std::string, std::size_t, std::less<>>& columns_;
  const std::vector<std::string>& fields_;
};

PaperCell cell_of(const Fields& f) {
  PaperCell c{.paper = f.text("paper"),
              .table = f.text("table"),
              .source = f.text("source"),
              .line = f.count("line"),
              .as_printed = f.text("as_printed"),
              .task = f.text("task"),
              .gpus = f.count("gpus"),
              .strategy = f.text("strategy"),
              .precision = f.text("precision"),
              .pin_memory = f.text("pin_memory"),
              .image_size = f.count("image_size"),
              .model = f.text("model"),
              .recipe = f.text("recipe"),
              .dataset = f.text("dataset"),
              .batch = f.count("batch"),
              .epochs = f.count("epochs"),
              .train_samples = f.count("train_samples"),
              .metric = f.text("metric"),
              .value = f.real("value"),
              .unit = f.text("unit"),
              .not_reproducible = f.text("not_reproducible"),
              .note = f.text("note")};
  for (const char* column : {"paper", "table", "source", "as_printed", "metric", "unit"}) {
    f.require(!f.text(column).empty(), column, "a value");
  }
  f.require(c.line >= 1, "line", "the line of the source that prints the number (from 1)");
  f.require(c.task == "image" || c.task == "llm", "task", "image or llm");
  f.require(c.precision.empty() || !paper_precision_runs(c.precision).empty(), "precision", "FP64, FP32, FP16 or ''");
  f.require(c.pin_memory.empty() || c.pin_memory == "true" || c.pin_memory == "false", "pin_memory",
            "true, false or ''");
  const double printed = paper_number(c.as_printed);
  f.require(std::abs(printed - c.value) <= 1e-9 * std::max(1.0, std::abs(c.value)), "value",
            fmt::format("what as_printed '{}' reads, {}", c.as_printed, printed));
  if (!c.not_reproducible.empty()) return c;
  const PaperMetric* metric = find_paper_metric(c.metric);
  f.require(metric != nullptr, "metric", "one of mgbench's paper metrics (or a not_reproducible reason)");
  f.require(c.unit == metric->unit, "unit", fmt::format("the unit of {}, {}", metric->name, metric->unit));
  if (metric->quantity != PaperQuantity::kTestAccuracy && metric->quantity != PaperQuantity::kSPerIt) {
    f.require(c.gpus > 0, "gpus", "the GPU count of a time");
    f.require(c.epochs > 0, "epochs", "the epochs of a time");
  }
  return c;
}

}  // namespace

std::span<const PaperMetric> paper_metrics() { return kMetrics; }

const PaperMetric* find_paper_metric(std::string_view name) {
  for (const PaperMetric& m : kMetrics) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

std::vector<std::string_view> paper_precision_runs(std::string_view paper_precision) {
  if (paper_precision == "FP64") return {"fp64"};
  if (paper_precision == "FP32") return {"fp32", "tf32"};
  if (paper_precision == "FP16") return {"fp16"};
  return {};
}

double paper_number(std::string_view as_printed) {
  std::string text;
  for (const char c : as_printed) {
    if (c != ' ') text += c == ',' ? '.' : c;
  }
  if (!text.empty() && text.back() == '%') text.pop_back();
  if (text.find(':') != std::string::npos) {  // h:mm:ss or m:ss: whole numbers, base 60
    double seconds = 0;
    std::size_t parts = 0;
    for (std::size_t start = 0;; start = text.find(':', start) + 1) {
      const std::size_t end = std::min(text.find(':', start), text.size());
      int part = 0;
      const auto [stop, error] = std::from_chars(text.data() + start, text.data() + end, part);
      if (end == start || error != std::errc() || stop != text.data() + end || part < 0) return results::kNaN;
      seconds = seconds * 60 + part;
      if (++parts > 3) return results::kNaN;
      if (end == text.size()) return seconds;
    }
  }
  double x = 0;
  const auto [stop, error] = std::from_chars(text.data(), text.data() + text.size(), x);
  return !text.empty() && error == std::errc() && stop == text.data() + text.size() ? x : results::kNaN;
}

std::vector<PaperCell> parse_paper_values(std::string_view csv_text, std::string_view name) {
  const CsvRows rows = csv_rows(csv_text, name);
  MGBENCH_REQUIRE(!rows.rows.empty(), DataError, "paper values '{}': empty (expected a header row)", name);
  std::map<std::string, std::size_t, std::less<>> columns;
  for (std::size_t k = 0; k < rows.rows[0].size(); ++k) {
    MGBENCH_REQUIRE(columns.emplace(rows.rows[0][k], k).second, DataError,
                    "paper values '{}' line {}: the header names column '{}' twice", name, rows.lines[0],
                    rows.rows[0][k]);
  }
  for (const std::string_view column : kColumns) {
    MGBENCH_REQUIRE(columns.find(column) != columns.end(), DataError,
                    "paper values '{}' line {}: no column '{}' in the header", name, rows.lines[0], column);
  }
  std::vector<PaperCell> cells;
  for (std::size_t i = 1; i < rows.rows.size(); ++i) {
    MGBENCH_REQUIRE(rows.rows[i].size() == rows.rows[0].size(), DataError,
                    "paper values '{}' line {}: {} fields, the header has {}", name, rows.lines[i], rows.rows[i].size(),
                    rows.rows[0].size());
    cells.push_back(cell_of(Fields(name, rows.lines[i], columns, rows.rows[i])));
  }
  return cells;
}

const std::vector<PaperCell>& paper_values() {
  static const std::vector<PaperCell> cells = [] {
    for (const auto& file : paper_data::kFiles) {
      if (file.name == "paper_values") return parse_paper_values(file.text, "python/mgbench_analysis/paper_values.csv");
    }
    throw DataError("python/mgbench_analysis/paper_values.csv was not built in (modules/report/CMakeLists.txt)");
  }();
  return cells;
}

}  // namespace mgbench::report
