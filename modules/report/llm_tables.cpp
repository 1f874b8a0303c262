// `mgbench report`'s tables of LLM fine-tuning runs: the LLM table (the paper's Table 5 / Fig. 4,
// with per-rank scaling against the 1-rank run of the same workload) and the DPO table (reward
// accuracy and margin from the recipe's per-step metrics).
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "report/reference.h"
#include "report/report.h"
#include "report/run_cells.h"
#include "report/table.h"
#include "report/workload.h"

namespace mgbench::report {
namespace {

// --padding of a text run; runs written before the option existed were padded.
std::string padding_of(const results::RunRecord& run) {
  const std::string padding = run.display("padding");
  return padding.empty() ? "pad" : padding;
}

/// An LLM run with its per-rank tokens/s over the 1-rank runs' (their median) of the same workload
/// identity, timed over the same steps (the same --warmup-steps-excluded).
struct LlmRow {
  const results::RunRecord* run;
  std::optional<double> efficiency;
  std::string baseline_note;
};

/// The LLM runs among `runs`, in their order, each with its efficiency and baseline note.
std::vector<LlmRow> llm_rows(const std::vector<results::RunRecord>& runs) {
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
      std::vector<double> one_rank;  // tokens/s of the 1-rank runs (repeats: their median)
      for (const auto& o : runs) {
        if (is_llm_run(o) && is_completed(o) && o.integer("world_size") == 1 && identity_of(o) == identity_of(r) &&
            warmup_steps_excluded(o) == warmup_steps_excluded(r) && std::isfinite(o.summary.tokens_per_s)) {
          one_rank.push_back(o.summary.tokens_per_s);
        }
      }
      if (!one_rank.empty()) {
        row.efficiency =
            r.summary.tokens_per_s / static_cast<double>(r.integer("world_size").value_or(1)) / median(one_rank);
      }
    }
    rows.push_back(row);
  }
  return rows;
}

/// The eval loss where the run evaluated, else the final training loss.
double reported_loss(const results::RunRecord& r) {
  return std::isfinite(r.summary.eval_loss) ? r.summary.eval_loss : r.summary.final_loss;
}

/// The model's weight bytes per parameter (NF4 projections ~0.52 where bf16 is 2: the paper's QLoRA
/// saving); NaN for runs written before it was recorded.
double bytes_per_param(const LlmRow& w) { return w.run->real("weight_bytes_per_parameter").value_or(results::kNaN); }

/// What one rank holds of the model (parameters, gradients, optimizer states; the sharding decides
/// it) [MiB]; NaN for runs written before it was recorded.
double state_mib(const LlmRow& w) {
  double bytes = 0;
  for (const char* name : {"parameter_bytes_per_rank", "gradient_bytes_per_rank", "optimizer_state_bytes_per_rank"}) {
    const auto v = w.run->integer(name);
    if (!v) return results::kNaN;
    bytes += static_cast<double>(*v);
  }
  return bytes / (1024.0 * 1024.0);
}

/// The LLM table's columns, in the table's (and the CSV's) order.
std::vector<Column<LlmRow>> llm_columns() {
  auto attribute = [](const char* name) { return [name](const LlmRow& w) { return w.run->display(name); }; };
  std::vector<Column<LlmRow>> columns = {
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
      {"ops/layer", "(step)", 9, "ops_per_layer_step",
       [](const LlmRow& w) { return number(ops_per_layer_step(*w.run), 0); },
       [](const LlmRow& w) { return number(ops_per_layer_step(*w.run), 1); }},
      {"", "", 0, "ops_per_step",
       [](const LlmRow& w) {
         const std::int64_t ops = w.run->summary.ops_per_step;
         return ops < 0 ? std::string("-") : std::to_string(ops);
       }},
      {"loss", "", 8, "loss",
       [](const LlmRow& w) {
         const auto& s = w.run->summary;
         return std::isfinite(s.eval_loss) ? "eval " + number(s.eval_loss, 4) : number(s.final_loss, 4);
       },
       [](const LlmRow& w) { return number(reported_loss(*w.run), 4); }},
      {"", "", 0, "resumes", [](const LlmRow& w) { return std::to_string(resumes(*w.run)); }},
      {"recipe", "", -8, "recipe", [](const LlmRow& w) { return recipe_of(*w.run); }},
      {"shard", "", -5, "sharding", [](const LlmRow& w) { return w.run->display("sharding"); }},
      {"pad", "", -4, "padding", [](const LlmRow& w) { return padding_of(*w.run); }},
      {"peak mem", "(MiB)", 8, "peak_memory_mib", [](const LlmRow& w) { return number(peak_memory_mib(*w.run), 0); }},
      {"state", "(MiB/rk)", 9, "model_state_mib_per_rank", [](const LlmRow& w) { return number(state_mib(w), 0); },
       [](const LlmRow& w) { return number(state_mib(w), 1); }},
      {"", "", 0, "parameter_bytes_per_rank", attribute("parameter_bytes_per_rank")},
      {"", "", 0, "gradient_bytes_per_rank", attribute("gradient_bytes_per_rank")},
      {"", "", 0, "optimizer_state_bytes_per_rank", attribute("optimizer_state_bytes_per_rank")},
      {"B/par", "", 6, "weight_bytes_per_param", [](const LlmRow& w) { return number(bytes_per_param(w), 2); },
       [](const LlmRow& w) { return number(bytes_per_param(w), 3); }},
  };
  return columns;
}

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

void print_llm(std::ostream& out, const std::vector<results::RunRecord>& runs, Format format) {
  const std::vector<LlmRow> rows = llm_rows(runs);
  const std::vector<Column<LlmRow>> columns = llm_columns();
  const bool csv = format == Format::kCsv;
  if (!csv) {
    out << "# LLM runs (Lawenda et al. 2025, Table 5 / Fig. 4): s/it per optimizer step; tokens/s of all ranks "
           "(real tokens), padded/s with the padding computed (equal with --padding none); eff_1rank = per-rank "
           "tokens/s vs 1 rank; ops/layer = ATen ops dispatched per optimizer step and decoder layer (the host's "
           "work, as torch.profiler counts aten:: events); state = parameters + gradients + optimizer "
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

}  // namespace mgbench::report
