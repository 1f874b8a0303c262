#include "report/report.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace mgbench::report {
namespace {

/// What makes two runs the same workload; precision can be overridden to find the fp64 peer.
std::string workload_key(const results::RunRecord& r, const std::string& precision) {
  return fmt::format("{}|{}|{}|{}|{}|{}|{}", r.display("task"), precision, r.display("pin_memory"),
                     r.display("image_size"), r.display("epochs"), r.display("batch_size"), r.display("train_samples"));
}

std::string workload_key(const results::RunRecord& r) { return workload_key(r, r.display("precision")); }

std::string percent(const std::optional<double>& v) { return v ? fmt::format("{:.2f}", *v * 100.0) : "-"; }

std::string number(double v, int digits) { return std::isfinite(v) ? fmt::format("{:.{}f}", v, digits) : "-"; }

/// Rank 0's peak memory in MiB (GPU: the caching allocator's peak; CPU: peak resident set); NaN unrecorded.
double peak_memory_mib(const results::RunRecord& r) {
  constexpr double kMiB = 1024.0 * 1024.0;
  return r.summary.peak_memory_bytes >= 0 ? static_cast<double>(r.summary.peak_memory_bytes) / kMiB : results::kNaN;
}

// Table rows as nccl-tests prints them: the header and the units row start with '#', data rows
// with two spaces, so the columns line up and `grep -v '^#'` leaves only data.
template <typename... Args>
void header_row(std::ostream& out, const char* layout, Args&&... columns) {
  out << "# " << fmt::format(fmt::runtime(layout), std::forward<Args>(columns)...);
}
template <typename... Args>
void data_row(std::ostream& out, const char* layout, Args&&... columns) {
  out << "  " << fmt::format(fmt::runtime(layout), std::forward<Args>(columns)...);
}

/// How often a run was resumed from a checkpoint (`mgbench ... --resume`); 0 when never.
std::int64_t resumes(const results::RunRecord& r) { return r.integer("resumes").value_or(0); }

/// '#' lines under a table: why a run failed, which runs were preempted or resumed.
void print_notes(std::ostream& out, const results::RunRecord& r) {
  if (r.status == "failed" && !r.error.empty()) {
    out << fmt::format("# {} failed: {}\n", r.run_id, r.error);
  } else if (r.status == "preempted") {
    out << fmt::format("# {} preempted: it continues with the same options plus --resume --checkpoint-dir\n", r.run_id);
  }
  if (resumes(r) > 0) {
    out << fmt::format(
        "# {} resumed {} time(s) from a checkpoint: its times leave out the time away and the "
        "checkpoint writing, and include each restart's warm-up\n",
        r.run_id, resumes(r));
  }
}

}  // namespace

std::vector<Row> build_rows(const std::vector<results::RunRecord>& runs) {
  std::vector<Row> rows;
  for (const auto& run : runs) {
    Row row{&run, std::nullopt, std::nullopt};
    if (is_completed(run)) {
      const results::RunRecord* one_rank = nullptr;
      const results::RunRecord* fp64 = nullptr;
      for (const auto& other : runs) {
        if (!is_completed(other)) continue;
        // Later runs replace earlier candidates; a same-strategy 1-rank run beats any other.
        if (other.integer("world_size") == 1 && workload_key(other) == workload_key(run)) {
          const bool same_strategy = other.display("strategy") == run.display("strategy");
          if (one_rank == nullptr || same_strategy || one_rank->display("strategy") != run.display("strategy")) {
            one_rank = &other;
          }
        }
        if (workload_key(other) == workload_key(run, "fp64") && other.display("strategy") == run.display("strategy") &&
            other.integer("world_size") == run.integer("world_size")) {
          fp64 = &other;
        }
      }
      if (one_rank != nullptr) row.efficiency_vs_1_rank = one_rank->summary.total_s / run.summary.total_s;
      if (fp64 != nullptr && run.display("precision") != "fp64") {
        row.efficiency_vs_fp64 = fp64->summary.total_s / run.summary.total_s;
      }
    }
    rows.push_back(row);
  }
  return rows;
}

bool is_completed(const results::RunRecord& run) {
  return run.status == "completed" && std::isfinite(run.summary.total_s);
}

bool is_llm_run(const results::RunRecord& run) { return run.display("task").rfind("llm", 0) == 0; }

bool is_comm_run(const results::RunRecord& run) { return run.display("task") == "comm"; }

namespace {
/// The recipe of a run; runs written before recipes were recorded are the jobs' only recipes then.
std::string recipe_of(const results::RunRecord& r) {
  const std::string recipe = r.display("recipe");
  return !recipe.empty() ? recipe : is_llm_run(r) ? "lora" : "classification";
}
}  // namespace

bool is_dpo_run(const results::RunRecord& run) { return is_llm_run(run) && recipe_of(run) == "dpo"; }

void print_llm(std::ostream& out, const std::vector<results::RunRecord>& runs, Format format) {
  auto key = [](const results::RunRecord& r) {
    return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}", recipe_of(r), r.display("model"), r.display("dataset"),
                       r.display("precision"), r.display("batch_size"), r.display("grad_accum"),
                       r.display("train_samples"), r.display("max_seq_len"));
  };
  auto efficiency = [&](const results::RunRecord& r) -> std::optional<double> {
    if (!is_completed(r) || !std::isfinite(r.summary.tokens_per_s)) return std::nullopt;
    const results::RunRecord* one = nullptr;
    for (const auto& o : runs) {
      if (is_llm_run(o) && is_completed(o) && o.integer("world_size") == 1 && key(o) == key(r) &&
          std::isfinite(o.summary.tokens_per_s)) {
        one = &o;
      }
    }
    if (one == nullptr) return std::nullopt;
    return r.summary.tokens_per_s / static_cast<double>(r.integer("world_size").value_or(1)) /
           one->summary.tokens_per_s;
  };
  auto loss = [](const results::RunRecord& r) {
    return std::isfinite(r.summary.eval_loss) ? r.summary.eval_loss : r.summary.final_loss;
  };
  // The model's weight bytes per parameter (NF4 projections ~0.52 where bf16 is 2: the paper's QLoRA
  // saving); NaN for runs written before it was recorded.
  auto bytes_per_param = [](const results::RunRecord& r) {
    return r.real("weight_bytes_per_parameter").value_or(results::kNaN);
  };
  if (format == Format::kCsv) {
    out << "file,run_id,status,task,ranks,model,dataset,precision,batch_size,grad_accum,s_per_it,tokens_per_s,"
           "efficiency_vs_1_rank_pct,mfu_pct,loss,resumes,recipe,peak_memory_mib,weight_bytes_per_param\n";
    for (const auto& r : runs) {
      if (!is_llm_run(r)) continue;
      out << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", r.file, r.run_id, r.status,
                         r.display("task"), r.display("world_size"), r.display("model"), r.display("dataset"),
                         r.display("precision"), r.display("batch_size"), r.display("grad_accum"),
                         number(r.summary.s_per_it, 4), number(r.summary.tokens_per_s, 1), percent(efficiency(r)),
                         number(r.summary.mfu * 100.0, 2), number(loss(r), 4), resumes(r), recipe_of(r),
                         number(peak_memory_mib(r), 0), number(bytes_per_param(r), 3));
    }
    return;
  }
  out << "# LLM runs (Lawenda et al. 2025, Table 5 / Fig. 4): s/it per optimizer step; tokens/s of all ranks "
         "(real tokens); eff_1rank = per-rank tokens/s vs 1 rank\n";
  const char* header = "{:<28} {:<8} {:>5} {:<16} {:<9} {:<5} {:>7} {:>8} {:>10} {:>9} {:>6} {:>8} {:>6} {:>8} {:<9}\n";
  header_row(out, header, "run", "recipe", "ranks", "model", "dataset", "prec", "batch", "s/it", "tokens/s",
             "eff_1rank", "MFU", "peak mem", "B/par", "loss", "status");
  header_row(out, header, "", "", "", "", "", "", "(xacc)", "(s)", "", "(%)", "(%)", "(MiB)", "", "", "");
  for (const auto& r : runs) {
    if (!is_llm_run(r)) continue;
    std::string model = r.display("model");
    if (model.size() > 16) model = "..." + model.substr(model.size() - 13);
    data_row(
        out, header, r.run_id, recipe_of(r), r.display("world_size"), model, r.display("dataset"),
        r.display("precision"), fmt::format("{}x{}", r.display("batch_size"), r.display("grad_accum")),
        number(r.summary.s_per_it, 3), number(r.summary.tokens_per_s, 0), percent(efficiency(r)),
        number(r.summary.mfu * 100.0, 1), number(peak_memory_mib(r), 0), number(bytes_per_param(r), 2),
        std::isfinite(r.summary.eval_loss) ? "eval " + number(r.summary.eval_loss, 4) : number(r.summary.final_loss, 4),
        r.status);
  }
  for (const auto& r : runs) {
    if (is_llm_run(r)) print_notes(out, r);
  }
}

namespace {

/// The mean over ranks of a recipe metric over each rank's last min(10, steps) steps; NaN without it.
double final_metric(const results::RunRecord& r, const std::string& name) {
  const auto column = std::find(r.metric_names.begin(), r.metric_names.end(), name);
  if (column == r.metric_names.end()) return results::kNaN;
  const auto k = static_cast<std::size_t>(column - r.metric_names.begin());
  double sum = 0;
  std::size_t n = 0;
  for (const auto& rank : r.metrics) {
    for (std::size_t i = rank.size() - std::min<std::size_t>(10, rank.size()); i < rank.size(); ++i) {
      sum += rank[i][k];
      ++n;
    }
  }
  return n > 0 ? sum / static_cast<double>(n) : results::kNaN;
}

}  // namespace

void print_dpo(std::ostream& out, const std::vector<results::RunRecord>& runs, Format format) {
  if (format == Format::kCsv) {
    out << "file,run_id,status,ranks,model,dataset,precision,batch_size,grad_accum,s_per_it,tokens_per_s,"
           "padded_tokens_per_s,peak_memory_mib,loss,reward_accuracy_pct,reward_margin,resumes\n";
    for (const auto& r : runs) {
      if (!is_dpo_run(r)) continue;
      out << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", r.file, r.run_id, r.status,
                         r.display("world_size"), r.display("model"), r.display("dataset"), r.display("precision"),
                         r.display("batch_size"), r.display("grad_accum"), number(r.summary.s_per_it, 4),
                         number(r.summary.tokens_per_s, 1), number(r.summary.padded_tokens_per_s, 1),
                         number(peak_memory_mib(r), 0), number(r.summary.final_loss, 4),
                         number(final_metric(r, "reward_accuracy") * 100.0, 2),
                         number(final_metric(r, "reward_margin"), 4), resumes(r));
    }
    return;
  }
  out << "# DPO runs (Lawenda et al. 2025b): s/it per optimizer step; tokens/s of all ranks, real and padded (as "
         "TorchTune logs them) tokens of chosen and rejected; reward accuracy and margin: mean over ranks of the "
         "last 10 steps\n";
  const char* header = "{:<28} {:>5} {:<16} {:<9} {:<5} {:>7} {:>8} {:>10} {:>10} {:>9} {:>8} {:>8} {:>8} {:<9}\n";
  header_row(out, header, "run", "ranks", "model", "dataset", "prec", "batch", "s/it", "tokens/s", "padded/s",
             "peak mem", "loss", "rew_acc", "margin", "status");
  header_row(out, header, "", "", "", "", "", "(xacc)", "(s)", "", "", "(MiB)", "", "(%)", "", "");
  for (const auto& r : runs) {
    if (!is_dpo_run(r)) continue;
    std::string model = r.display("model");
    if (model.size() > 16) model = "..." + model.substr(model.size() - 13);
    data_row(out, header, r.run_id, r.display("world_size"), model, r.display("dataset"), r.display("precision"),
             fmt::format("{}x{}", r.display("batch_size"), r.display("grad_accum")), number(r.summary.s_per_it, 3),
             number(r.summary.tokens_per_s, 0), number(r.summary.padded_tokens_per_s, 0), number(peak_memory_mib(r), 0),
             number(r.summary.final_loss, 4), number(final_metric(r, "reward_accuracy") * 100.0, 1),
             number(final_metric(r, "reward_margin"), 3), r.status);
  }
  for (const auto& r : runs) {
    if (is_dpo_run(r)) print_notes(out, r);
  }
}

void print(std::ostream& out, const std::vector<Row>& rows, Format format) {
  if (format == Format::kCsv) {
    out << "file,run_id,status,ranks,strategy,precision,pin_memory,image_size,epochs,batch_size,total_s,"
           "test_accuracy_pct,img_per_s,efficiency_vs_1_rank_pct,efficiency_vs_fp64_pct,resumes\n";
    for (const auto& row : rows) {
      const auto& r = *row.run;
      out << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", r.file, r.run_id, r.status,
                         r.display("world_size"), r.display("strategy"), r.display("precision"),
                         r.display("pin_memory"), r.display("image_size"), r.display("epochs"), r.display("batch_size"),
                         number(r.summary.total_s, 3), number(r.summary.test_accuracy * 100.0, 2),
                         number(r.summary.samples_per_s, 1), percent(row.efficiency_vs_1_rank),
                         percent(row.efficiency_vs_fp64), resumes(r));
    }
    return;
  }
  out << fmt::format("# mgbench report: {} run(s)\n", rows.size());
  out << "# efficiency vs 1 rank = T(1 rank) / T(n ranks); vs FP64 = T(fp64) / T(precision), same ranks "
         "(Lawenda et al. 2025, Table 2)\n";
  const char* header = "{:<36} {:>5} {:<7} {:<9} {:<5} {:>5} {:>6} {:>10} {:>8} {:>9} {:>9} {:>9} {:<9}\n";
  header_row(out, header, "run", "ranks", "strat", "precision", "pin", "size", "epochs", "total", "test_acc", "thruput",
             "eff_1rank", "eff_fp64", "status");
  header_row(out, header, "", "", "", "", "", "(px)", "", "(s)", "(%)", "(img/s)", "(%)", "(%)", "");
  for (const auto& row : rows) {
    const auto& r = *row.run;
    data_row(out, header, r.run_id, r.display("world_size"), r.display("strategy"), r.display("precision"),
             r.display("pin_memory"), r.display("image_size"), r.display("epochs"), number(r.summary.total_s, 1),
             number(r.summary.test_accuracy * 100.0, 2), number(r.summary.samples_per_s, 1),
             percent(row.efficiency_vs_1_rank), percent(row.efficiency_vs_fp64), r.status);
  }
  for (const auto& row : rows) print_notes(out, *row.run);
}

namespace {

/// One row of a comm run: a collective, dtype, placement and size, across ranks.
struct CommRow {
  const results::CommRecord* first = nullptr;  // rank 0's record
  double min_s = INFINITY, avg_s = 0, max_s = -INFINITY;
  std::int64_t wrong = 0;
  bool checked = true;
};

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

}  // namespace

void print_comm(std::ostream& out, const std::vector<results::RunRecord>& runs, Format format) {
  if (format == Format::kCsv) {
    out << "file,run_id,status,ranks,backend,device,collective,dtype,op,root,in_place,bytes,count,time_min_s,"
           "time_avg_s,time_max_s,algbw_gbs,busbw_gbs,wrong\n";
  } else {
    out << "# comm runs (mgbench comm, nccl-tests' columns): time of one launch, min / avg / max across ranks; "
           "algbw = size / avg time, busbw = algbw x bus factor\n";
  }
  const char* header = "{:<28} {:>5} {:<5} {:<15} {:<5} {:<5} {:<6} {:>12} {:>10} {:>10} {:>10} {:>8} {:>8} {:>6}\n";
  if (format == Format::kTable) {
    header_row(out, header, "run", "ranks", "bknd", "collective", "type", "redop", "place", "size", "time_min",
               "time_avg", "time_max", "algbw", "busbw", "#wrong");
    header_row(out, header, "", "", "", "", "", "", "", "(B)", "(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", "");
  }
  for (const auto& r : runs) {
    if (!is_comm_run(r)) continue;
    for (const CommRow& row : comm_rows(r)) {
      const auto& c = *row.first;
      const double algbw = static_cast<double>(c.bytes) / row.avg_s / 1e9;
      const double busbw = c.time_s > 0 ? algbw * c.busbw_gbs / c.algbw_gbs : results::kNaN;  // the bus factor
      const std::string wrong =
          row.checked ? std::to_string(row.wrong) : std::string(format == Format::kCsv ? "" : "N/A");
      if (format == Format::kCsv) {
        out << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{:.9g},{:.9g},{:.9g},{},{},{}\n", r.file, r.run_id,
                           r.status, r.display("world_size"), r.display("backend"), r.display("device"), c.collective,
                           c.dtype, c.op, c.root, static_cast<int>(c.in_place), c.bytes, c.count, row.min_s, row.avg_s,
                           row.max_s, number(algbw, 4), number(busbw, 4), wrong);
      } else {
        data_row(out, header, r.run_id, r.display("world_size"), r.display("backend"), c.collective, c.dtype,
                 c.op[0] != '\0' ? c.op : "none", c.in_place != 0 ? "in" : "out", c.bytes, number(row.min_s * 1e6, 2),
                 number(row.avg_s * 1e6, 2), number(row.max_s * 1e6, 2), number(algbw, 3), number(busbw, 3), wrong);
      }
    }
  }
  if (format == Format::kTable) {
    for (const auto& r : runs) {
      if (is_comm_run(r)) print_notes(out, r);
    }
  }
}

void print_phases(std::ostream& out, const std::vector<results::RunRecord>& runs) {
  const char* row = "{:<10} {:>10} {:>10} {:>10} {:>8}\n";
  for (const auto& run : runs) {
    out << fmt::format("# {} ({} ranks, {}, {}, {} px): training time by phase, summed over {} epoch(s)\n", run.run_id,
                       run.display("world_size"), run.display("strategy"), run.display("precision"),
                       run.display("image_size"), run.epochs.empty() ? 0 : run.epochs.front().size());
    if (run.epochs.empty() || run.epochs.front().empty()) {
      // A run preempted (or failed, or still running) in its first epoch has no epoch rows yet.
      out << fmt::format("# (no completed epoch yet: status {})\n", run.status);
      continue;
    }
    header_row(out, row, "phase", "min", "avg", "max", "share");
    header_row(out, row, "", "(s)", "(s)", "(s)", "(%)");
    std::vector<double> train_s;
    for (const auto& rank : run.epochs) {
      double t = 0;
      for (const auto& e : rank) t += e.train_s;
      train_s.push_back(t);
    }
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
      const double n = static_cast<double>(run.epochs.size());
      if (n == 0) continue;
      data_row(out, row, name, number(lo, 3), number(sum / n, 3), number(hi, 3), number(100.0 * share / n, 1));
    }
    double lo = INFINITY, hi = -INFINITY, sum = 0;
    for (double t : train_s) {
      lo = std::min(lo, t);
      hi = std::max(hi, t);
      sum += t;
    }
    if (!train_s.empty()) {
      data_row(out, row, "train", number(lo, 3), number(sum / static_cast<double>(train_s.size()), 3), number(hi, 3),
               "100.0");
    }
    double window = 0, exposed = 0;
    for (const auto& rank : run.epochs) {
      for (const auto& e : rank) {
        if (std::isfinite(e.allreduce_window_s)) window += e.allreduce_window_s;
        exposed += e.phases.allreduce_s;
      }
    }
    if (window > 0) {
      out << fmt::format(
          "# all-reduce overlap: {:.1f} % of the all-reduce window hidden behind backward "
          "(window {:.3f} s, exposed {:.3f} s, summed over ranks)\n",
          100.0 * std::max(0.0, 1.0 - exposed / window), window, exposed);
    }
    out << "\n";
  }
}

void print_cuda(std::ostream& out, const std::vector<results::RunRecord>& runs, std::size_t top_kernels) {
  for (const auto& run : runs) {
    out << fmt::format("# {} ({} ranks, {}, {}, pin_memory {}, upscale {}, {} px): CUDA activity", run.run_id,
                       run.display("world_size"), run.display("strategy"), run.display("precision"),
                       run.display("pin_memory"), run.display("upscale"), run.display("image_size"));
    if (run.cuda.empty()) {
      out << ": none recorded (CPU run, or --cupti false)\n\n";
      continue;
    }
    out << fmt::format(", profile window {}\n", run.display("profile_window"));
    const char* row = "{:<6} {:>9} {:>9} {:>11} {:>10} {:>9} {:>7} {:>10} {:>7} {:>10} {:>7} {:>10} {:>10}\n";
    header_row(out, row, "rank", "window", "HtoD", "HtoD", "HtoD/smp", "HtoD", "HtoD", "kernels", "kernels", "NCCL",
               "NCCL", "peak alloc", "peak resv");
    header_row(out, row, "", "(s)", "(count)", "(MiB)", "(B)", "(s)", "(%)", "(s)", "(%)", "(s)", "(%)", "(MiB)",
               "(MiB)");
    constexpr double kMiB = 1024.0 * 1024.0;
    for (std::size_t r = 0; r < run.cuda.size(); ++r) {
      const auto& c = run.cuda[r];
      const double w = c.window_s > 0 ? c.window_s : NAN;
      data_row(out, row, r, number(c.window_s, 2), c.htod_count, number(static_cast<double>(c.htod_bytes) / kMiB, 1),
               c.samples > 0 ? number(static_cast<double>(c.htod_bytes) / static_cast<double>(c.samples), 0)
                             : std::string("-"),
               number(c.htod_s, 3), number(100 * c.htod_s / w, 2), number(c.kernel_s, 2),
               number(100 * c.kernel_s / w, 1), number(c.nccl_kernel_s, 3), number(100 * c.nccl_kernel_s / w, 1),
               number(static_cast<double>(c.peak_allocated_bytes) / kMiB, 0),
               number(static_cast<double>(c.peak_reserved_bytes) / kMiB, 0));
      if (c.dropped_records > 0) out << fmt::format("# (rank {}: {} CUPTI records dropped)\n", r, c.dropped_records);
    }
    // API calls, averaged over ranks.
    const char* api_row = "{:<28} {:>12} {:>10} {:>8}\n";
    header_row(out, api_row, "API (mean over ranks)", "calls", "time", "");
    header_row(out, api_row, "", "", "(s)", "(%)");
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
      data_row(out, api_row, first[i].name, number(calls / n, 0), number(time / n, 3), number(100 * share / n, 2));
    }
    const char* kernel_row = "{:<60} {:>10} {:>10} {:>8}\n";
    header_row(out, kernel_row, "top kernels (rank 0)", "count", "time", "");
    header_row(out, kernel_row, "", "", "(s)", "(%)");
    const auto& kernels = run.cuda_kernels.front();
    const double w0 = run.cuda.front().window_s;
    for (std::size_t i = 0; i < std::min(top_kernels, kernels.size()); ++i) {
      std::string name = kernels[i].name;
      if (name.size() > 60) name = name.substr(0, 57) + "...";
      data_row(out, kernel_row, name, kernels[i].count, number(kernels[i].time_s, 3),
               number(w0 > 0 ? 100 * kernels[i].time_s / w0 : NAN, 2));
    }
    out << "\n";
  }
}

}  // namespace mgbench::report
