#include "report/reference.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "report/predict.h"
#include "report/report.h"
#include "report/run_cells.h"
#include "report/table.h"
#include "report/workload.h"

namespace mgbench::report {
namespace {

using Sample = RunMetric;

}  // namespace

std::vector<RunMetric> run_metrics(const results::RunRecord& r) {
  std::vector<Sample> out;
  auto add = [&](std::string metric, bool higher, double v) {
    if (std::isfinite(v) && v > 0) out.push_back({std::move(metric), higher, v});
  };
  constexpr double kMiB = 1024.0 * 1024.0;
  const double peak_mib =
      r.summary.peak_memory_bytes >= 0 ? static_cast<double>(r.summary.peak_memory_bytes) / kMiB : results::kNaN;
  if (is_comm_run(r)) {
    // busbw at the largest size of each collective, dtype and placement (the bandwidth regime).
    std::map<std::string, std::pair<std::int64_t, double>> largest;
    std::vector<std::string> order;
    for (const CommRow& row : comm_rows(r)) {
      const auto& c = *row.first;
      const std::string key =
          fmt::format("{}:{}:{}", c.collective, c.dtype, c.in_place != 0 ? "in-place" : "out-of-place");
      auto [it, fresh] = largest.try_emplace(key, -1, results::kNaN);
      if (fresh) order.push_back(key);
      if (c.bytes > it->second.first) it->second = {c.bytes, row.busbw_gbs()};
    }
    for (const auto& key : order) add(fmt::format("busbw:{}:{}B", key, largest[key].first), true, largest[key].second);
  } else if (is_llm_run(r)) {
    add("tokens/s", true, r.summary.tokens_per_s);
    add("s/it", false, r.summary.s_per_it);
    add("peak_MiB", false, peak_mib);
  } else {
    add("img/s", true, r.summary.samples_per_s);
    const double epochs = static_cast<double>(r.integer("epochs").value_or(0));
    add("s/epoch", false, epochs > 0 ? r.summary.total_s / epochs : results::kNaN);
    add("peak_MiB", false, peak_mib);
  }
  return out;
}

std::string comparison_group(const results::RunRecord& r) {
  return fmt::format("{}|ranks={}|nodes={}|strategy={}|backend={}|warmup_steps_excluded={}", workload_identity(r),
                     r.display("world_size"), r.display("nodes"), r.display("strategy"), r.display("backend"),
                     warmup_steps_excluded(r));
}

std::string short_workload(const results::RunRecord& r) {
  if (is_comm_run(r)) return r.display("backend");
  if (is_llm_run(r)) {
    return fmt::format("{}/{}/{}x{}", recipe_of(r), r.display("precision"), r.display("batch_size"),
                       r.display("grad_accum"));
  }
  return fmt::format("{}/{}px/{}", r.display("precision"), r.display("image_size"), r.display("strategy"));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const results::RunRecord* median_run(std::vector<const results::RunRecord*> runs) {
  if (runs.empty()) return nullptr;
  // Stable: runs of equal times keep their order (the files', then the runs').
  std::stable_sort(runs.begin(), runs.end(),
                   [](const auto* a, const auto* b) { return a->summary.total_s < b->summary.total_s; });
  return runs[(runs.size() - 1) / 2];
}

namespace {

// One rule for every metric (reference.h): the slowdown, ratio or its inverse, against 1 + tolerance.
Verdict judge(double ratio, bool higher_is_better, double tolerance) {
  const double slowdown = higher_is_better ? 1.0 / ratio : ratio;
  if (slowdown > 1.0 + tolerance) return Verdict::kRegressed;
  if (slowdown < 1.0 / (1.0 + tolerance)) return Verdict::kImproved;
  return Verdict::kHolds;
}

// The row of a run that did not complete (either side): nothing of it can be judged.
ReferenceRow status_row(const results::RunRecord& r, const std::string& reference_run) {
  ReferenceRow row;
  row.run = r.run_id;
  row.workload = short_workload(r);
  row.reference_run = reference_run;
  row.ranks = r.integer("world_size").value_or(0);
  row.hardware = hardware_cell(r);
  row.metric = "status";
  row.measured = row.reference = row.ratio = results::kNaN;
  row.verdict = Verdict::kFailed;
  return row;
}

std::string status_note(const results::RunRecord& r, std::string_view side) {
  return r.error.empty() ? fmt::format("{}{} {}", side, r.run_id, r.status)
                         : fmt::format("{}{} {}: {}", side, r.run_id, r.status, r.error);
}

/// The reference run of the same task nearest to `run`, and where their identities differ.
std::string nearest_note(const results::RunRecord& run, const std::vector<results::RunRecord>& reference) {
  const results::RunRecord* nearest = nullptr;
  std::vector<WorkloadDifference> nearest_differences;
  for (const auto& other : reference) {
    if (other.display("task") != run.display("task")) continue;
    auto differences = workload_differences(run, other);
    if (nearest == nullptr || differences.size() <= nearest_differences.size()) {
      nearest = &other;
      nearest_differences = std::move(differences);
    }
  }
  if (nearest == nullptr) return fmt::format("{}: no reference run of task {}", run.run_id, run.display("task"));
  if (nearest_differences.empty()) {
    return fmt::format("{}: no reference run of this workload at {} rank(s), {} node(s), strategy {}, backend {}",
                       run.run_id, run.display("world_size"), run.display("nodes"), run.display("strategy"),
                       run.display("backend"));
  }
  return fmt::format("{}: no reference run of this workload on {}; the nearest, {}, differs in {}", run.run_id,
                     hardware(run), nearest->run_id, describe(nearest_differences));
}

}  // namespace

const char* to_string(Verdict verdict) {
  switch (verdict) {
    case Verdict::kHolds:
      return "holds";
    case Verdict::kImproved:
      return "improved";
    case Verdict::kRegressed:
      return "REGRESSED";
    case Verdict::kFailed:
      return "FAILED";
  }
  return "?";
}

bool ReferenceCheck::any_regressed() const {
  return std::any_of(rows.begin(), rows.end(), [](const ReferenceRow& r) { return r.verdict == Verdict::kRegressed; });
}

bool ReferenceCheck::any_failed() const {
  return std::any_of(rows.begin(), rows.end(), [](const ReferenceRow& r) { return r.verdict == Verdict::kFailed; });
}

int ReferenceCheck::exit_status() const {
  if (any_failed()) return 2;
  return any_regressed() ? 1 : 0;
}

ReferenceCheck compare_to_reference(const std::vector<results::RunRecord>& reference,
                                    const std::vector<results::RunRecord>& runs, double tolerance) {
  ReferenceCheck check;
  std::map<std::string, std::vector<const results::RunRecord*>> references;
  std::size_t predicted = 0;  // `mgbench predict`'s runs: no measurement to judge or judge by
  for (const auto& r : reference) {
    if (is_prediction_run(r)) {
      ++predicted;
    } else if (is_completed(r)) {
      references[comparison_group(r)].push_back(&r);
    } else {
      check.rows.push_back(status_row(r, r.run_id));
      check.notes.push_back(status_note(r, "reference run "));
    }
  }
  std::vector<std::string> order;
  std::map<std::string, std::vector<const results::RunRecord*>> measured;
  for (const auto& r : runs) {
    if (is_prediction_run(r)) {
      ++predicted;
      continue;
    }
    const std::string group = comparison_group(r);
    const auto ref = references.find(group);
    if (!is_completed(r)) {
      check.rows.push_back(status_row(r, ref != references.end() ? ref->second.back()->run_id : "-"));
      check.notes.push_back(status_note(r, ""));
      continue;
    }
    if (ref == references.end()) {
      check.notes.push_back(nearest_note(r, reference));
      continue;
    }
    if (!measured.contains(group)) order.push_back(group);
    measured[group].push_back(&r);
  }
  if (predicted > 0) {
    check.notes.push_back(
        fmt::format("{} predicted run(s) (mgbench predict) left out: predictions are not "
                    "measurements",
                    predicted));
  }
  for (const auto& group : order) {
    const auto& mine = measured[group];
    const auto& theirs = references[group];
    for (const Sample& first : run_metrics(*mine.back())) {
      std::vector<double> a, b;
      for (const auto* r : mine) {
        for (const auto& s : run_metrics(*r)) {
          if (s.metric == first.metric) a.push_back(s.value);
        }
      }
      for (const auto* r : theirs) {
        for (const auto& s : run_metrics(*r)) {
          if (s.metric == first.metric) b.push_back(s.value);
        }
      }
      if (a.empty() || b.empty()) continue;
      ReferenceRow row;
      row.run = mine.back()->run_id;
      row.workload = short_workload(*mine.back());
      row.reference_run = theirs.back()->run_id;
      row.ranks = mine.back()->integer("world_size").value_or(0);
      row.hardware = hardware_cell(*mine.back());
      row.metric = first.metric;
      row.higher_is_better = first.higher_is_better;
      row.measured = median(a);
      row.reference = median(b);
      row.measured_runs = a.size();
      row.reference_runs = b.size();
      row.ratio = row.measured / row.reference;
      row.verdict = judge(row.ratio, row.higher_is_better, tolerance);
      check.rows.push_back(row);
    }
  }
  return check;
}

void print_reference(std::ostream& out, const ReferenceCheck& check, const std::string& reference_path,
                     double tolerance, bool csv) {
  using R = ReferenceRow;
  const std::vector<Column<R>> columns = {
      {"run", "", -28, "run_id", [](const R& r) { return r.run; }},
      {"workload", "", -18, "workload", [](const R& r) { return r.workload; }},
      {"ranks", "", 5, "ranks", [](const R& r) { return std::to_string(r.ranks); }},
      {"device", "", -14, "device", [](const R& r) { return r.hardware; }},
      {"metric", "", -36, "metric", [](const R& r) { return r.metric; }},
      {"better", "", -6, "better", [](const R& r) { return std::string(r.higher_is_better ? "higher" : "lower"); }},
      {"reference", "", 12, "reference", [](const R& r) { return scaled_number(r.reference); },
       [](const R& r) { return number(r.reference, 6); }},
      {"measured", "", 12, "measured", [](const R& r) { return scaled_number(r.measured); },
       [](const R& r) { return number(r.measured, 6); }},
      {"ratio", "", 7, "ratio", [](const R& r) { return number(r.ratio, 3); },
       [](const R& r) { return number(r.ratio, 5); }},
      {"n", "(ref/run)", 9, "", [](const R& r) { return fmt::format("{}/{}", r.reference_runs, r.measured_runs); }},
      {"", "", 0, "reference_runs", [](const R& r) { return std::to_string(r.reference_runs); }},
      {"", "", 0, "measured_runs", [](const R& r) { return std::to_string(r.measured_runs); }},
      {"verdict", "", -9, "verdict", [](const R& r) { return std::string(to_string(r.verdict)); }},
      {"", "", 0, "reference_run_id", [](const R& r) { return r.reference_run; }},
  };
  if (!csv) {
    out << fmt::format(
        "# mgbench report --reference {} --tolerance {:g}: each workload beside the reference's "
        "(same identity, ranks, nodes, strategy, backend); medians over the runs of each side; "
        "ratio = measured / reference\n",
        reference_path, tolerance * 100.0);
  }
  write_table(out, columns, check.rows, csv);
  if (!csv) {
    for (const auto& note : check.notes) out << "# " << note << "\n";
    std::size_t bad = 0;
    for (const auto& r : check.rows) bad += r.verdict == Verdict::kRegressed || r.verdict == Verdict::kFailed;
    out << fmt::format("# {} metric(s) compared, {} regressed or failed: {}\n", check.rows.size(), bad,
                       bad == 0 ? "PASS" : "FAIL");
    if (check.any_failed()) out << "# a run did not complete: nothing of it can be judged (exit 2)\n";
  }
}

}  // namespace mgbench::report
