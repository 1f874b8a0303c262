// `mgbench report --phases` and `--cuda`: per run, where the training time went (each phase's
// seconds across ranks, the all-reduce overlap, the stragglers) and what the GPU did (CUPTI's copies,
// kernels, API calls and peak memory per rank, rank 0's top kernels).
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <iterator>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "report/report.h"
#include "report/run_cells.h"
#include "report/stragglers.h"
#include "report/table.h"

namespace mgbench::report {
namespace {

/// A row of a table-only listing: its cells as text.
using TextRow = std::vector<std::string>;

/// Columns of text rows: header, unit and width of each cell in order.
std::vector<Column<TextRow>> text_columns(
    std::initializer_list<std::tuple<std::string_view, std::string_view, int>> spec) {
  std::vector<Column<TextRow>> columns;
  std::size_t k = 0;
  for (const auto& [header, unit, width] : spec) {
    columns.push_back({header, unit, width, "", [k](const TextRow& row) { return row[k]; }});
    ++k;
  }
  return columns;
}

constexpr double kMiB = 1024.0 * 1024.0;

/// A run's CUDA metrics, one row per rank: the profile window, the HtoD copies (count, MiB, bytes per
/// training sample, evaluation and staging MiB), kernel and NCCL kernel time, peak memory.
std::vector<TextRow> cuda_rank_rows(const results::RunRecord& run) {
  // HtoD by what made it: schema 6 (issue 32); before, only the total, which evaluation and staging inflated.
  const bool by_purpose = run.integer("schema_version").value_or(0) >= 6;
  const auto mib = [&](std::int64_t bytes) {
    return by_purpose ? number(static_cast<double>(bytes) / kMiB, 1) : std::string("-");
  };
  std::vector<TextRow> rows;
  for (std::size_t r = 0; r < run.cuda.size(); ++r) {
    const auto& c = run.cuda[r];
    const double w = c.window_s > 0 ? c.window_s : NAN;
    rows.push_back({std::to_string(r), number(c.window_s, 2), std::to_string(c.htod_count),
                    number(static_cast<double>(c.htod_bytes) / kMiB, 1),
                    by_purpose && c.samples > 0
                        ? number(static_cast<double>(c.htod_train_bytes) / static_cast<double>(c.samples), 0)
                        : std::string("-"),
                    mib(c.htod_eval_bytes), mib(c.htod_staging_bytes), number(c.htod_s, 3),
                    number(100 * c.htod_s / w, 2), number(c.kernel_s, 2), number(100 * c.kernel_s / w, 1),
                    number(c.nccl_kernel_s, 3), number(100 * c.nccl_kernel_s / w, 1),
                    number(static_cast<double>(c.peak_allocated_bytes) / kMiB, 0),
                    number(static_cast<double>(c.peak_reserved_bytes) / kMiB, 0)});
  }
  return rows;
}

/// Calls of rank r's API functions named in `names` (results::kLaunchApis, kHostWaitApis) in the window.
template <std::size_t N>
double api_calls(const results::RunRecord& run, std::size_t r, const char* const (&names)[N]) {
  double calls = 0;
  for (const auto& a : run.cuda_api[r]) {
    if (std::find(std::begin(names), std::end(names), std::string_view(a.name)) != std::end(names)) {
      calls += static_cast<double>(a.calls);
    }
  }
  return calls;
}

/// A run's steps on the device, one row per rank (schema 12; "-" before): the steps that started in
/// the window, the window per step, kernels, launch calls and host waits per step, the GPU-busy
/// share (kernel_busy_s / window_s), and the window's time between the steps with the kernels
/// launched there (schema 13: left out of the others; "-" before, whose window held them). Launch calls are
/// results::kLaunchApis' (CUPTI records the driver calls an application or library makes itself, not those inside the
/// runtime's); waits results::kHostWaitApis'.
std::vector<TextRow> cuda_step_rows(const results::RunRecord& run) {
  std::vector<TextRow> rows;
  for (std::size_t r = 0; r < run.cuda.size(); ++r) {
    const auto& c = run.cuda[r];
    const double steps = c.steps > 0 ? static_cast<double>(c.steps) : NAN;
    const double launches = api_calls(run, r, results::kLaunchApis);
    const double waits = api_calls(run, r, results::kHostWaitApis);
    rows.push_back(
        {std::to_string(r), c.steps >= 0 ? std::to_string(c.steps) : std::string("-"),
         number(1e3 * c.window_s / steps, 2), number(static_cast<double>(c.kernel_count) / steps, 1),
         number(launches / steps, 1), number(waits / steps, 1),
         number(c.window_s > 0 ? 100 * c.kernel_busy_s / c.window_s : NAN, 1), number(c.between_steps_s, 2),
         c.between_steps_kernel_count >= 0 ? std::to_string(c.between_steps_kernel_count) : std::string("-")});
  }
  return rows;
}

/// A run's CUDA API calls, averaged over ranks, in rank 0's order; calls no rank made are left out.
std::vector<TextRow> cuda_api_rows(const results::RunRecord& run) {
  std::vector<TextRow> rows;
  const auto& first = run.cuda_api.front();
  for (std::size_t i = 0; i < first.size(); ++i) {
    double calls = 0, time = 0, share = 0;
    for (std::size_t r = 0; r < run.cuda_api.size(); ++r) {
      for (const auto& a : run.cuda_api[r]) {
        if (std::string_view(a.name) != first[i].name) continue;
        calls += static_cast<double>(a.calls);
        time += a.time_s;
        share += run.cuda[r].window_s > 0 ? a.time_s / run.cuda[r].window_s : 0;
      }
    }
    const double n = static_cast<double>(run.cuda_api.size());
    if (calls == 0) continue;
    rows.push_back({first[i].name, number(calls / n, 0), number(time / n, 3), number(100 * share / n, 2)});
  }
  return rows;
}

/// Rank 0's first `top_kernels` kernels, names cut to 60 characters.
std::vector<TextRow> top_kernel_rows(const results::RunRecord& run, std::size_t top_kernels) {
  std::vector<TextRow> rows;
  const auto& kernels = run.cuda_kernels.front();
  const double w0 = run.cuda.front().window_s;
  for (std::size_t i = 0; i < std::min(top_kernels, kernels.size()); ++i) {
    std::string name = kernels[i].name;
    if (name.size() > 60) name = name.substr(0, 57) + "...";
    rows.push_back({name, std::to_string(kernels[i].count), number(kernels[i].time_s, 3),
                    number(w0 > 0 ? 100 * kernels[i].time_s / w0 : NAN, 2)});
  }
  return rows;
}

}  // namespace

void print_phases(std::ostream& out, const std::vector<results::RunRecord>& runs) {
  const auto columns = text_columns(
      {{"phase", "", -16}, {"min", "(s)", 10}, {"avg", "(s)", 10}, {"max", "(s)", 10}, {"share", "(%)", 8}});
  for (const auto& run : runs) {
    out << fmt::format("# {} ({} ranks, {}, {}, {} px): training time by phase, summed over {} epoch(s)\n", run.run_id,
                       run.display("world_size"), run.display("strategy"), run.display("precision"),
                       run.display("image_size"), run.epochs.empty() ? 0 : run.epochs.front().size());
    if (run.epochs.empty() || run.epochs.front().empty()) {
      // A run preempted (or failed, or still running) in its first epoch has no epoch rows yet.
      out << fmt::format("# (no completed epoch yet: status {})\n", run.status);
      continue;
    }
    std::vector<double> train_s;
    for (const auto& rank : run.epochs) {
      double t = 0;
      for (const auto& e : rank) t += e.train_s;
      train_s.push_back(t);
    }
    const double n = static_cast<double>(run.epochs.size());
    std::vector<TextRow> rows;
    for (const auto& [name, field] : results::kPhaseFields) {
      double lo = INFINITY, hi = -INFINITY, sum = 0, share = 0;
      for (std::size_t r = 0; r < run.epochs.size(); ++r) {
        double t = 0;
        for (const auto& e : run.epochs[r]) t += e.phases.*field;
        lo = std::min(lo, t);
        hi = std::max(hi, t);
        sum += t;
        share += train_s[r] > 0 ? t / train_s[r] : 0.0;
      }
      rows.push_back(
          {std::string(name), number(lo, 3), number(sum / n, 3), number(hi, 3), number(100.0 * share / n, 1)});
    }
    const auto [lo, hi] = std::minmax_element(train_s.begin(), train_s.end());
    double sum = 0;
    for (double t : train_s) sum += t;
    rows.push_back({"train", number(*lo, 3), number(sum / n, 3), number(*hi, 3), "100.0"});
    write_table(out, columns, rows, /*csv=*/false);
    const auto [window, exposed] = all_reduce_times(run);
    if (window > 0) {
      out << fmt::format(
          "# all-reduce overlap: {:.1f} % of the all-reduce window hidden behind backward "
          "(window {:.3f} s, exposed {:.3f} s, summed over ranks)\n",
          100.0 * std::max(0.0, 1.0 - exposed / window), window, exposed);
      if (run.integer("schema_version").value_or(0) < 6) {
        out << "# (a run of schema < 6: its allreduce phase also holds the buffer broadcast and the loss "
               "normaliser's all-reduce, so the overlap reads low)\n";
      }
    }
    print_stragglers(out, run);
    out << "\n";
  }
}

namespace {

/// The host's side of a step (issue 47): the ATen operators rank 0 dispatched in one optimizer step.
void print_host_ops(std::ostream& out, const results::RunRecord& run) {
  if (run.summary.ops_per_step < 0) return;
  const double per_layer = ops_per_layer_step(run);
  out << fmt::format(
      "# host (rank 0): {} ATen ops dispatched per optimizer step{}, as torch.profiler counts aten:: "
      "events\n",
      run.summary.ops_per_step, std::isfinite(per_layer) ? fmt::format(", {:.0f} per decoder layer", per_layer) : "");
}

/// Rank 0's steps by what CUDA graphs did in them (results::StepRecord::cuda_graph), with their
/// mean wall times: a capture step pays a device sync and the capture, and the replayed steps' mean
/// is the step once every shape has its graph. Nothing for a run without graphs.
void print_graph_steps(std::ostream& out, const results::RunRecord& run) {
  const results::GraphSteps& g = run.graph_steps;
  if (!g.recorded() || run.text("cuda_graphs_decision").value_or("") != "on") return;
  constexpr std::pair<std::int8_t, const char*> kKinds[] = {{results::kGraphReplayed, "replayed"},
                                                            {results::kGraphCaptured, "captured"},
                                                            {results::kGraphMixed, "mixed"},
                                                            {results::kGraphEager, "eager"}};
  std::vector<std::string> parts;
  for (const auto& [kind, name] : kKinds) {
    const std::int64_t n = g.steps[static_cast<std::size_t>(kind)];
    parts.push_back(n > 0 ? fmt::format("{} {} (mean {:.2f} ms)", n, name, 1e3 * g.mean_s(kind))
                          : fmt::format("0 {}", name));
  }
  out << fmt::format("# cuda graphs (rank 0's steps): {}\n", fmt::join(parts, ", "));
}

}  // namespace

void print_cuda(std::ostream& out, const std::vector<results::RunRecord>& runs, std::size_t top_kernels) {
  const auto rank_columns = text_columns({{"rank", "", -6},
                                          {"window", "(s)", 9},
                                          {"HtoD", "(count)", 9},
                                          {"HtoD", "(MiB)", 11},
                                          {"train/smp", "(B)", 10},
                                          {"eval", "(MiB)", 9},
                                          {"staging", "(MiB)", 9},
                                          {"HtoD", "(s)", 9},
                                          {"HtoD", "(%)", 7},
                                          {"kernels", "(s)", 10},
                                          {"kernels", "(%)", 7},
                                          {"NCCL", "(s)", 10},
                                          {"NCCL", "(%)", 7},
                                          {"peak alloc", "(MiB)", 10},
                                          {"peak resv", "(MiB)", 10}});
  const auto step_columns = text_columns({{"rank", "", -6},
                                          {"steps", "(window)", 9},
                                          {"window/step", "(ms)", 12},
                                          {"kernels", "(/step)", 10},
                                          {"launches", "(/step)", 10},
                                          {"host waits", "(/step)", 11},
                                          {"GPU busy", "(%)", 9},
                                          {"between", "steps (s)", 10},
                                          {"kernels", "(between)", 10}});
  const auto api_columns =
      text_columns({{"API (mean over ranks)", "", -28}, {"calls", "", 12}, {"time", "(s)", 10}, {"", "(%)", 8}});
  const auto kernel_columns =
      text_columns({{"top kernels (rank 0)", "", -60}, {"count", "", 10}, {"time", "(s)", 10}, {"", "(%)", 8}});
  for (const auto& run : runs) {
    out << fmt::format("# {} ({} ranks, {}, {}, pin_memory {}, upscale {}, {} px): CUDA activity", run.run_id,
                       run.display("world_size"), run.display("strategy"), run.display("precision"),
                       run.display("pin_memory"), run.display("upscale"), run.display("image_size"));
    if (run.cuda.empty()) {
      out << ": none recorded (CPU run, or --cupti false)\n";
      print_host_ops(out, run);
      print_graph_steps(out, run);
      out << "\n";
      continue;
    }
    out << fmt::format(", profile window {}\n", run.display("profile_window"));
    write_table(out, rank_columns, cuda_rank_rows(run), /*csv=*/false);
    if (run.integer("schema_version").value_or(0) >= 13) {
      out << "# HtoD count, MiB, s: the steps' copies; train/smp, eval, staging: by what made them, copies "
             "between steps included (the evaluation's are)\n";
    }
    write_table(out, step_columns, cuda_step_rows(run), /*csv=*/false);
    for (std::size_t r = 0; r < run.cuda.size(); ++r) {
      if (run.cuda[r].dropped_records > 0) {
        out << fmt::format("# (rank {}: {} CUPTI records dropped)\n", r, run.cuda[r].dropped_records);
      }
    }
    write_table(out, api_columns, cuda_api_rows(run), /*csv=*/false);
    write_table(out, kernel_columns, top_kernel_rows(run, top_kernels), /*csv=*/false);
    print_host_ops(out, run);
    print_graph_steps(out, run);
    out << "\n";
  }
}

}  // namespace mgbench::report
