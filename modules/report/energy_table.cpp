// `mgbench report --energy`: joules per sample (per token for text recipes), power, clocks and
// throttling of each run, from every rank's rank_<r>/energy row (profile/telemetry.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "report/report.h"
#include "report/table.h"

namespace mgbench::report {
namespace {

/// A run's energy over its ranks. A GPU's energy counts once per rank; a node's (RAPL) once per node,
/// each of its ranks carrying its share.
struct EnergyRow {
  std::string file;
  std::string run;
  std::vector<std::string> sources;  // the ranks' sources, distinct, in rank order ("nvml", "rapl", "none")
  std::int64_t ranks = 0;
  double span_s = results::kNaN;  // the longest rank's
  double energy_j = results::kNaN;
  std::int64_t samples = 0;
  std::int64_t tokens = 0;
  double max_power_w = results::kNaN;
  double mean_sm_clock_mhz = results::kNaN;  // over the ranks that read it
  double max_temperature_c = results::kNaN;
  double throttled_share = results::kNaN;  // the most throttled rank's share of its span

  double per_sample_j() const { return samples > 0 ? energy_j / static_cast<double>(samples) : results::kNaN; }
  double per_token_j() const { return tokens > 0 ? energy_j / static_cast<double>(tokens) : results::kNaN; }
  double mean_power_w() const { return span_s > 0 ? energy_j / span_s : results::kNaN; }
};

double max_present(double a, double b) { return std::isnan(a) ? b : std::isnan(b) ? a : std::max(a, b); }

EnergyRow energy_row(const results::RunRecord& run) {
  EnergyRow row;
  row.file = run.file;
  row.run = run.run_id;
  row.ranks = static_cast<std::int64_t>(run.energy.size());
  double energy = 0, clock_sum = 0;
  std::int64_t clocks = 0;
  bool complete = !run.energy.empty();
  for (const results::EnergyRecord& e : run.energy) {
    const std::string source(e.source, ::strnlen(e.source, sizeof(e.source)));
    if (std::find(row.sources.begin(), row.sources.end(), source) == row.sources.end()) row.sources.push_back(source);
    complete = complete && std::isfinite(e.energy_j);
    energy += e.energy_j * e.node_share;
    row.samples += e.samples;
    row.tokens += e.tokens;
    row.span_s = max_present(row.span_s, e.span_s);
    row.max_power_w = max_present(row.max_power_w, e.max_power_w);
    row.max_temperature_c = max_present(row.max_temperature_c, e.max_temperature_c);
    if (std::isfinite(e.mean_sm_clock_mhz)) clock_sum += e.mean_sm_clock_mhz, ++clocks;
    if (e.span_s > 0) row.throttled_share = max_present(row.throttled_share, e.throttled_s / e.span_s);
  }
  // A run's energy is every rank's: one rank without a counter leaves it unknown, not smaller.
  if (complete) row.energy_j = energy;
  if (clocks > 0) row.mean_sm_clock_mhz = clock_sum / static_cast<double>(clocks);
  return row;
}

std::vector<Column<EnergyRow>> energy_columns() {
  // The numeric columns: the table's text with `digits` decimals (scaled_number where -1), the CSV's in full.
  struct Numeric {
    std::string_view header, unit;
    int width;
    std::string_view csv;
    double (*get)(const EnergyRow&);
    int digits;
  };
  const Numeric numbers[] = {
      {"span", "(s)", 9, "span_s", [](const EnergyRow& r) { return r.span_s; }, 1},
      {"energy", "(J)", 11, "energy_j", [](const EnergyRow& r) { return r.energy_j; }, 1},
      {"J/sample", "(J)", 10, "j_per_sample", [](const EnergyRow& r) { return r.per_sample_j(); }, -1},
      {"J/token", "(J)", 10, "j_per_token", [](const EnergyRow& r) { return r.per_token_j(); }, -1},
      {"power", "(W)", 8, "mean_power_w", [](const EnergyRow& r) { return r.mean_power_w(); }, 1},
      {"max power", "(W)", 9, "max_power_w", [](const EnergyRow& r) { return r.max_power_w; }, 1},
      {"SM clock", "(MHz)", 8, "mean_sm_clock_mhz", [](const EnergyRow& r) { return r.mean_sm_clock_mhz; }, 0},
      {"max temp", "(C)", 8, "max_temperature_c", [](const EnergyRow& r) { return r.max_temperature_c; }, 0},
      {"throttled", "(%)", 9, "throttled_pct", [](const EnergyRow& r) { return 100 * r.throttled_share; }, 1},
  };
  std::vector<Column<EnergyRow>> columns;
  // The key columns of the other tables (a run id is unique only within its file).
  columns.push_back({"", "", 0, "file", [](const EnergyRow& r) { return r.file; }});
  columns.push_back({"run", "", -24, "run_id", [](const EnergyRow& r) { return r.run; }});
  columns.push_back({"ranks", "", 5, "ranks", [](const EnergyRow& r) { return std::to_string(r.ranks); }});
  columns.push_back(
      {"source", "", 10, "source", [](const EnergyRow& r) { return fmt::format("{}", fmt::join(r.sources, ",")); }});
  for (const Numeric& n : numbers) {
    columns.push_back({n.header, n.unit, n.width, n.csv,
                       [get = n.get, digits = n.digits](const EnergyRow& r) {
                         return digits < 0 ? scaled_number(get(r)) : number(get(r), digits);
                       },
                       [get = n.get](const EnergyRow& r) {
                         // "-" for a value not recorded, as every other table's CSV prints it
                         return std::isfinite(get(r)) ? fmt::format("{:.6g}", get(r)) : std::string("-");
                       }});
  }
  return columns;
}

}  // namespace

void print_energy(std::ostream& out, const std::vector<results::RunRecord>& runs, bool csv) {
  std::vector<EnergyRow> rows;
  std::vector<std::string> without;
  for (const auto& run : runs) {
    if (run.energy.empty()) {
      without.push_back(run.run_id);
    } else {
      rows.push_back(energy_row(run));
    }
  }
  if (!csv) out << "# Energy over each run's training loop (J/sample: all ranks' energy / samples computed)\n";
  write_table(out, energy_columns(), rows, csv);
  if (csv) return;
  for (const EnergyRow& r : rows) {
    if (std::find(r.sources.begin(), r.sources.end(), "none") != r.sources.end()) {
      out << fmt::format("# {}: no energy counter on a rank's node (no NVML GPU, RAPL absent or root-only)\n", r.run);
    }
  }
  if (!without.empty()) {
    out << fmt::format("# no energy recorded (--telemetry off, or written before schema 9): {}\n",
                       fmt::join(without, ", "));
  }
}

}  // namespace mgbench::report
