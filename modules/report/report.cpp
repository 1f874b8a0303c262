#include "report/report.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "report/stragglers.h"
#include "report/table.h"
#include "report/workload.h"

namespace mgbench::report {
namespace {

std::string percent(const std::optional<double>& v) { return v ? fmt::format("{:.2f}", *v * 100.0) : "-"; }

/// Rank 0's peak memory in MiB (GPU: the caching allocator's peak; CPU: peak resident set); NaN unrecorded.
double peak_memory_mib(const results::RunRecord& r) {
  constexpr double kMiB = 1024.0 * 1024.0;
  return r.summary.peak_memory_bytes >= 0 ? static_cast<double>(r.summary.peak_memory_bytes) / kMiB : results::kNaN;
}

/// A model path cut to its last 13 characters for a 16-character column.
std::string short_model(const results::RunRecord& r) {
  std::string model = r.display("model");
  return model.size() > 16 ? "..." + model.substr(model.size() - 13) : model;
}

/// "<batch>x<grad-accum>".
std::string batch_x_accum(const results::RunRecord& r) {
  return fmt::format("{}x{}", r.display("batch_size"), r.display("grad_accum"));
}

/// How often a run was resumed from a checkpoint (`mgbench ... --resume`); 0 when never.
std::int64_t resumes(const results::RunRecord& r) { return r.integer("resumes").value_or(0); }

/// '#' lines under a table: why a run failed, which runs were preempted or resumed.
void print_notes(std::ostream& out, const results::RunRecord& r) {
  if ((r.status == results::kStatusFailed || r.status == results::kStatusAborted) && !r.error.empty()) {
    out << fmt::format("# {} {}: {}\n", r.run_id, r.status, r.error);
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
  std::vector<std::string> identities;  // each run's, once
  for (const auto& run : runs) identities.push_back(workload_identity(run));
  std::vector<Row> rows;
  for (const auto& run : runs) {
    Row row{&run, std::nullopt, std::nullopt, {}};
    if (is_completed(run)) {
      const std::string& identity = identities[static_cast<std::size_t>(&run - runs.data())];
      const std::string fp64_identity = workload_identity(run, {{"precision", "fp64"}});
      const results::RunRecord* one_rank = nullptr;
      const results::RunRecord* fp64 = nullptr;
      for (const auto& other : runs) {
        if (!is_completed(other)) continue;
        const std::string& other_identity = identities[static_cast<std::size_t>(&other - runs.data())];
        // Later runs replace earlier candidates; a same-strategy 1-rank run beats any other.
        if (other.integer("world_size") == 1 && other_identity == identity) {
          const bool same_strategy = other.display("strategy") == run.display("strategy");
          if (one_rank == nullptr || same_strategy || one_rank->display("strategy") != run.display("strategy")) {
            one_rank = &other;
          }
        }
        if (other_identity == fp64_identity && other.display("strategy") == run.display("strategy") &&
            other.integer("world_size") == run.integer("world_size")) {
          fp64 = &other;
        }
      }
      if (one_rank != nullptr) row.efficiency_vs_1_rank = one_rank->summary.total_s / run.summary.total_s;
      if (fp64 != nullptr && run.display("precision") != "fp64") {
        row.efficiency_vs_fp64 = fp64->summary.total_s / run.summary.total_s;
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

// --padding of a text run; runs written before the option existed were padded.
std::string padding_of(const results::RunRecord& run) {
  const std::string padding = run.display("padding");
  return padding.empty() ? "pad" : padding;
}

bool is_llm_run(const results::RunRecord& run) { return run.display("task").rfind("llm", 0) == 0; }

bool is_comm_run(const results::RunRecord& run) { return run.display("task") == "comm"; }

std::string recipe_of(const results::RunRecord& r) {
  const std::string recipe = r.display("recipe");
  return !recipe.empty() ? recipe : is_llm_run(r) ? "lora" : "classification";
}

bool is_dpo_run(const results::RunRecord& run) { return is_llm_run(run) && recipe_of(run) == "dpo"; }

void print_llm(std::ostream& out, const std::vector<results::RunRecord>& runs, Format format) {
  // Per-rank tokens/s over the 1-rank run's of the same workload identity.
  struct LlmRow {
    const results::RunRecord* run;
    std::optional<double> efficiency;
    std::string baseline_note;
  };
  std::vector<std::string> identities;  // each run's, once
  for (const auto& r : runs) identities.push_back(workload_identity(r));
  auto identity_of = [&](const results::RunRecord& r) -> const std::string& {
    return identities[static_cast<std::size_t>(&r - runs.data())];
  };
  std::vector<LlmRow> rows;
  for (const auto& r : runs) {
    if (!is_llm_run(r)) continue;
    LlmRow row{&r, std::nullopt, baseline_note(r, runs)};
    if (is_completed(r) && std::isfinite(r.summary.tokens_per_s)) {
      const results::RunRecord* one = nullptr;
      for (const auto& o : runs) {
        if (is_llm_run(o) && is_completed(o) && o.integer("world_size") == 1 && identity_of(o) == identity_of(r) &&
            std::isfinite(o.summary.tokens_per_s)) {
          one = &o;
        }
      }
      if (one != nullptr) {
        row.efficiency = r.summary.tokens_per_s / static_cast<double>(r.integer("world_size").value_or(1)) /
                         one->summary.tokens_per_s;
      }
    }
    rows.push_back(row);
  }
  auto loss = [](const results::RunRecord& r) {
    return std::isfinite(r.summary.eval_loss) ? r.summary.eval_loss : r.summary.final_loss;
  };
  auto attribute = [](const char* name) { return [name](const LlmRow& w) { return w.run->display(name); }; };
  // The model's weight bytes per parameter (NF4 projections ~0.52 where bf16 is 2: the paper's QLoRA
  // saving); NaN for runs written before it was recorded.
  auto bytes_per_param = [](const LlmRow& w) {
    return w.run->real("weight_bytes_per_parameter").value_or(results::kNaN);
  };
  // What one rank holds of the model (parameters, gradients, optimizer states; the sharding decides
  // it); NaN for runs written before it was recorded.
  auto state_mib = [](const LlmRow& w) {
    double bytes = 0;
    for (const char* name : {"parameter_bytes_per_rank", "gradient_bytes_per_rank", "optimizer_state_bytes_per_rank"}) {
      const auto v = w.run->integer(name);
      if (!v) return results::kNaN;
      bytes += static_cast<double>(*v);
    }
    return bytes / (1024.0 * 1024.0);
  };
  const std::vector<Column<LlmRow>> columns = {
      {"", "", 0, "file", [](const LlmRow& w) { return w.run->file; }},
      {"run", "", -28, "run_id", [](const LlmRow& w) { return w.run->run_id; }},
      {"status", "", -9, "status", [](const LlmRow& w) { return w.run->status; }},
      {"", "", 0, "task", attribute("task")},
      {"ranks", "", 5, "ranks", attribute("world_size")},
      {"nodes", "", 5, "nodes", attribute("nodes")},
      {"device", "", -14, "device", [](const LlmRow& w) { return hardware_cell(*w.run); }, attribute("device")},
      {"", "", 0, "gpu_model", attribute("gpu_model")},
      {"", "", 0, "nccl_transports", [](const LlmRow& w) { return w.run->summary.transports(); }},
      {"model", "", -16, "model", [](const LlmRow& w) { return short_model(*w.run); }, attribute("model")},
      {"dataset", "", -9, "dataset", attribute("dataset")},
      {"prec", "", -5, "precision", attribute("precision")},
      {"batch", "(xacc)", 7, "", [](const LlmRow& w) { return batch_x_accum(*w.run); }},
      {"", "", 0, "batch_size", attribute("batch_size")},
      {"", "", 0, "grad_accum", attribute("grad_accum")},
      {"s/it", "(s)", 8, "s_per_it", [](const LlmRow& w) { return number(w.run->summary.s_per_it, 3); },
       [](const LlmRow& w) { return number(w.run->summary.s_per_it, 4); }},
      {"tokens/s", "", 10, "tokens_per_s", [](const LlmRow& w) { return number(w.run->summary.tokens_per_s, 0); },
       [](const LlmRow& w) { return number(w.run->summary.tokens_per_s, 1); }},
      {"padded/s", "", 10, "padded_tokens_per_s",
       [](const LlmRow& w) { return number(w.run->summary.padded_tokens_per_s, 0); },
       [](const LlmRow& w) { return number(w.run->summary.padded_tokens_per_s, 1); }},
      {"eff_1rank", "(%)", 9, "efficiency_vs_1_rank_pct", [](const LlmRow& w) { return percent(w.efficiency); }},
      {"MFU", "(%)", 6, "mfu_pct", [](const LlmRow& w) { return number(w.run->summary.mfu * 100.0, 1); },
       [](const LlmRow& w) { return number(w.run->summary.mfu * 100.0, 2); }},
      {"loss", "", 8, "loss",
       [](const LlmRow& w) {
         const auto& s = w.run->summary;
         return std::isfinite(s.eval_loss) ? "eval " + number(s.eval_loss, 4) : number(s.final_loss, 4);
       },
       [&](const LlmRow& w) { return number(loss(*w.run), 4); }},
      {"", "", 0, "resumes", [](const LlmRow& w) { return std::to_string(resumes(*w.run)); }},
      {"recipe", "", -8, "recipe", [](const LlmRow& w) { return recipe_of(*w.run); }},
      {"shard", "", -5, "sharding", [](const LlmRow& w) { return w.run->display("sharding"); }},
      {"pad", "", -4, "padding", [](const LlmRow& w) { return padding_of(*w.run); }},
      {"peak mem", "(MiB)", 8, "peak_memory_mib", [](const LlmRow& w) { return number(peak_memory_mib(*w.run), 0); }},
      {"state", "(MiB/rk)", 9, "model_state_mib_per_rank", [&](const LlmRow& w) { return number(state_mib(w), 0); },
       [&](const LlmRow& w) { return number(state_mib(w), 1); }},
      {"", "", 0, "parameter_bytes_per_rank", attribute("parameter_bytes_per_rank")},
      {"", "", 0, "gradient_bytes_per_rank", attribute("gradient_bytes_per_rank")},
      {"", "", 0, "optimizer_state_bytes_per_rank", attribute("optimizer_state_bytes_per_rank")},
      {"B/par", "", 6, "weight_bytes_per_param", [&](const LlmRow& w) { return number(bytes_per_param(w), 2); },
       [&](const LlmRow& w) { return number(bytes_per_param(w), 3); }},
  };
  const bool csv = format == Format::kCsv;
  if (!csv) {
    out << "# LLM runs (Lawenda et al. 2025, Table 5 / Fig. 4): s/it per optimizer step; tokens/s of all ranks "
           "(real tokens), padded/s with the padding computed (equal with --padding none); eff_1rank = per-rank "
           "tokens/s vs 1 rank; state = parameters + gradients + optimizer "
           "states one rank holds (fsdp: its shards and the units gathered at the peak)\n";
  }
  write_table(out, columns, rows, csv);
  if (!csv) {
    for (const auto& row : rows) {
      print_notes(out, *row.run);
      if (!row.baseline_note.empty()) out << "# " << row.baseline_note << "\n";
    }
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
  std::vector<const results::RunRecord*> rows;
  for (const auto& r : runs) {
    if (is_dpo_run(r)) rows.push_back(&r);
  }
  using Run = const results::RunRecord*;
  auto attribute = [](const char* name) { return [name](Run r) { return r->display(name); }; };
  auto metric = [](const char* name, double scale, int digits) {
    return [=](Run r) { return number(final_metric(*r, name) * scale, digits); };
  };
  const std::vector<Column<Run>> columns = {
      {"", "", 0, "file", [](Run r) { return r->file; }},
      {"run", "", -28, "run_id", [](Run r) { return r->run_id; }},
      {"status", "", -9, "status", [](Run r) { return r->status; }},
      {"ranks", "", 5, "ranks", attribute("world_size")},
      {"model", "", -16, "model", [](Run r) { return short_model(*r); }, attribute("model")},
      {"dataset", "", -9, "dataset", attribute("dataset")},
      {"prec", "", -5, "precision", attribute("precision")},
      {"batch", "(xacc)", 7, "", [](Run r) { return batch_x_accum(*r); }},
      {"", "", 0, "batch_size", attribute("batch_size")},
      {"", "", 0, "grad_accum", attribute("grad_accum")},
      {"s/it", "(s)", 8, "s_per_it", [](Run r) { return number(r->summary.s_per_it, 3); },
       [](Run r) { return number(r->summary.s_per_it, 4); }},
      {"tokens/s", "", 10, "tokens_per_s", [](Run r) { return number(r->summary.tokens_per_s, 0); },
       [](Run r) { return number(r->summary.tokens_per_s, 1); }},
      {"padded/s", "", 10, "padded_tokens_per_s", [](Run r) { return number(r->summary.padded_tokens_per_s, 0); },
       [](Run r) { return number(r->summary.padded_tokens_per_s, 1); }},
      {"peak mem", "(MiB)", 9, "peak_memory_mib", [](Run r) { return number(peak_memory_mib(*r), 0); }},
      {"loss", "", 8, "loss", [](Run r) { return number(r->summary.final_loss, 4); }},
      {"rew_acc", "(%)", 8, "reward_accuracy_pct", metric("reward_accuracy", 100.0, 1),
       metric("reward_accuracy", 100.0, 2)},
      {"margin", "", 8, "reward_margin", metric("reward_margin", 1.0, 3), metric("reward_margin", 1.0, 4)},
      {"", "", 0, "resumes", [](Run r) { return std::to_string(resumes(*r)); }},
  };
  const bool csv = format == Format::kCsv;
  if (!csv) {
    out << "# DPO runs (Lawenda et al. 2025b): s/it per optimizer step; tokens/s of all ranks, real and padded (as "
           "TorchTune logs them) tokens of chosen and rejected; reward accuracy and margin: mean over ranks of the "
           "last 10 steps\n";
  }
  write_table(out, columns, rows, csv);
  if (!csv) {
    for (const auto* r : rows) print_notes(out, *r);
  }
}

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
  auto seconds = [](double CommRow::*field) {
    return [field](const L& l) { return fmt::format("{:.9g}", l.row.*field); };
  };
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
       [](const L& l) { return number(l.algbw, 4); }},
      {"busbw", "(GB/s)", 8, "busbw_gbs", [](const L& l) { return number(l.busbw, 3); },
       [](const L& l) { return number(l.busbw, 4); }},
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

void print_cuda(std::ostream& out, const std::vector<results::RunRecord>& runs, std::size_t top_kernels) {
  constexpr double kMiB = 1024.0 * 1024.0;
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
  const auto api_columns =
      text_columns({{"API (mean over ranks)", "", -28}, {"calls", "", 12}, {"time", "(s)", 10}, {"", "(%)", 8}});
  const auto kernel_columns =
      text_columns({{"top kernels (rank 0)", "", -60}, {"count", "", 10}, {"time", "(s)", 10}, {"", "(%)", 8}});
  for (const auto& run : runs) {
    out << fmt::format("# {} ({} ranks, {}, {}, pin_memory {}, upscale {}, {} px): CUDA activity", run.run_id,
                       run.display("world_size"), run.display("strategy"), run.display("precision"),
                       run.display("pin_memory"), run.display("upscale"), run.display("image_size"));
    if (run.cuda.empty()) {
      out << ": none recorded (CPU run, or --cupti false)\n\n";
      continue;
    }
    out << fmt::format(", profile window {}\n", run.display("profile_window"));
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
    write_table(out, rank_columns, rows, /*csv=*/false);
    for (std::size_t r = 0; r < run.cuda.size(); ++r) {
      if (run.cuda[r].dropped_records > 0) {
        out << fmt::format("# (rank {}: {} CUPTI records dropped)\n", r, run.cuda[r].dropped_records);
      }
    }
    // API calls, averaged over ranks.
    rows.clear();
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
    write_table(out, api_columns, rows, /*csv=*/false);
    rows.clear();
    const auto& kernels = run.cuda_kernels.front();
    const double w0 = run.cuda.front().window_s;
    for (std::size_t i = 0; i < std::min(top_kernels, kernels.size()); ++i) {
      std::string name = kernels[i].name;
      if (name.size() > 60) name = name.substr(0, 57) + "...";
      rows.push_back({name, std::to_string(kernels[i].count), number(kernels[i].time_s, 3),
                      number(w0 > 0 ? 100 * kernels[i].time_s / w0 : NAN, 2)});
    }
    write_table(out, kernel_columns, rows, /*csv=*/false);
    out << "\n";
  }
}

}  // namespace mgbench::report
