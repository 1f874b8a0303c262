// `mgbench report --paper`: each of the papers' cells (paper_values.cpp) beside the runs of its
// setting -- the median of the measured runs, projected to the paper's epochs and epoch size where
// they had others, else of `mgbench predict`'s runs -- as a table or CSV (report/table.h).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "axes/strategy.h"
#include "report/paper_table.h"
#include "report/predict.h"
#include "report/reference.h"
#include "report/report.h"
#include "report/run_cells.h"
#include "report/table.h"

namespace mgbench::report {
namespace {

/// Llama 3 8B's parameters (Llama 3.1 8B's alike): the 128,256 x 4,096 embedding and output head, 32
/// decoder layers of 218,112,000 and the final norm.
constexpr double kLlama3_8bParameters = 8'030'261'248.0;

/// What a run computes: a prediction's is the task of the run it predicts from.
std::string task_of(const results::RunRecord& r) {
  return is_prediction_run(r) ? r.display("predicted_task") : r.display("task");
}

/// Shaped like Llama 3 8B: its parameter count (+-1 %) where the run recorded one, else its name
/// ("llama3-8b", "llama3.1-8b", "Meta-Llama-3-8B-Instruct", ...).
bool is_llama3_8b(const results::RunRecord& r) {
  if (const auto parameters = r.real("model_parameters"))
    return std::abs(*parameters / kLlama3_8bParameters - 1) <= 0.01;
  std::string name;
  for (const char c : r.display("model")) {
    if (std::isalnum(static_cast<unsigned char>(c)) != 0)
      name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return name.find("llama3") != std::string::npos && name.find("8b") != std::string::npos;
}

bool model_matches(const PaperCell& c, const results::RunRecord& r) {
  if (c.model.empty()) return true;
  if (c.model == "llama3-8b") return is_llama3_8b(r);
  const std::string model = r.display("model");
  if (c.model == "mobilenet_v2") {  // torchvision's, at width 1; image runs before --model had only it
    return (model.empty() || model == c.model) && r.real("width_mult").value_or(1.0) == 1.0;
  }
  return model == c.model;
}

bool dataset_matches(const PaperCell& c, const results::RunRecord& r) {
  const std::string dataset = r.display("dataset");
  // Image runs before `dataset` was recorded read MNIST.
  return c.dataset.empty() || dataset == c.dataset || (dataset.empty() && c.task == "image" && c.dataset == "mnist");
}

/// One process drives every GPU of its node (dp, the paper's DataParallel baseline, in none of its
/// tables): its world_size is not its GPU count.
bool single_process(const results::RunRecord& r) {
  const std::string strategy = r.display("strategy");
  for (const axes::StrategyInfo& s : axes::strategy_choices()) {
    if (s.name == strategy) return s.single_process;
  }
  return false;
}

/// A completed run (measured or predicted) at the cell's setting, on one node.
bool matches(const PaperCell& c, const results::RunRecord& r) {
  if (!is_completed(r) || task_of(r) != c.task || r.integer("nodes").value_or(1) != 1 || single_process(r)) {
    return false;
  }
  const std::int64_t ranks = r.integer("world_size").value_or(1);
  if (c.gpus > 0 && ranks != c.gpus) return false;
  if (ranks > 1 && !c.strategy.empty() && r.display("strategy") != c.strategy) return false;
  if (!c.precision.empty()) {
    const auto precisions = paper_precision_runs(c.precision);
    if (std::find(precisions.begin(), precisions.end(), r.display("precision")) == precisions.end()) return false;
  }
  if (!c.pin_memory.empty() && r.display("pin_memory") != c.pin_memory) return false;
  if (c.image_size > 0 && r.integer("image_size") != c.image_size) return false;
  if (c.batch > 0 && r.integer("batch_size") != c.batch) return false;
  if (!c.recipe.empty() && recipe_of(r) != c.recipe) return false;
  return model_matches(c, r) && dataset_matches(c, r);
}

/// The card a run ran on: its gpu_model, else its CPU, said as such.
std::string card_of(const results::RunRecord& r) {
  const std::string gpu = r.display("gpu_model");
  if (!gpu.empty()) return gpu;
  if (r.display("device") == "cuda") return "GPU (model not recorded)";
  const std::string cpu = r.display("cpu_model");
  return cpu.empty() ? "CPU (model not recorded)" : "CPU: " + cpu;
}

/// What tells runs of one cell apart: one row each.
struct Variant {
  std::string precision;
  std::int64_t image_size = 0, batch_size = 0, grad_accum = 1;
  std::string upscale;
  std::string card;
  bool operator==(const Variant&) const = default;
};

Variant variant_of(const results::RunRecord& r) {
  return {r.display("precision"),
          r.integer("image_size").value_or(0),
          r.integer("batch_size").value_or(0),
          r.integer("grad_accum").value_or(1),
          r.display("upscale"),
          card_of(r)};
}

/// The variant as the setting's [...]: mgbench's precision, and what the paper leaves open.
std::string variant_text(const PaperCell& c, const Variant& v) {
  std::vector<std::string> parts{v.precision};
  if (c.image_size == 0 && v.image_size > 0) parts.push_back(fmt::format("{} px", v.image_size));
  if (c.batch == 0 && v.batch_size > 0) parts.push_back(fmt::format("batch {}", v.batch_size));
  if (v.grad_accum != 1) parts.push_back(fmt::format("grad-accum {}", v.grad_accum));
  if (!v.upscale.empty()) parts.push_back("upscale " + v.upscale);
  return fmt::format("{}", fmt::join(parts, ", "));
}

/// Samples one epoch of the run computed on, over its ranks (the epochs' records; a prediction's:
/// the measured run's train_samples, capped by max_steps); 0 unrecorded.
std::int64_t epoch_samples(const results::RunRecord& r) {
  std::int64_t sum = 0;
  for (const auto& rank : r.epochs) {
    if (!rank.empty()) sum += rank.front().samples;
  }
  if (sum > 0) return sum;
  std::int64_t samples = r.integer("train_samples").value_or(0);
  if (const std::int64_t steps = r.integer("max_steps").value_or(0); steps > 0) {
    samples = std::min(samples, steps * r.integer("batch_size").value_or(1) * r.integer("grad_accum").value_or(1) *
                                    r.integer("world_size").value_or(1));
  }
  return samples;
}

/// One run's value of a quantity, in the cell's unit.
struct RunValue {
  double value = results::kNaN;
  bool projected = false;
  std::string note;  // the projection, or the epochs an accuracy is after
};

RunValue run_value(const PaperCell& c, const results::RunRecord& r, PaperQuantity q) {
  if (q == PaperQuantity::kSPerIt) return {r.summary.s_per_it, false, ""};
  const std::int64_t epochs =
      r.summary.epochs_completed > 0 ? r.summary.epochs_completed : r.integer("epochs").value_or(0);
  const std::int64_t samples = epoch_samples(r);
  const bool other_size = c.train_samples > 0 && samples > 0 &&
                          std::abs(static_cast<double>(samples) / static_cast<double>(c.train_samples) - 1) > 0.01;
  const bool other_epochs = c.epochs > 0 && epochs != c.epochs;
  std::string ran = fmt::format("{} epoch(s)", epochs);
  if (other_size) ran += fmt::format(" x {} samples", samples);
  if (q == PaperQuantity::kTestAccuracy) {
    return {r.summary.test_accuracy * 100.0, false, other_epochs || other_size ? "after " + ran : ""};
  }
  if (epochs <= 0) return {};
  const double epoch_scale = static_cast<double>(c.epochs) / static_cast<double>(epochs);
  double scale = epoch_scale;
  if (other_size) scale *= static_cast<double>(c.train_samples) / static_cast<double>(samples);
  std::string note = other_epochs || other_size ? "projected from " + ran : "";
  if (c.train_samples > 0 && samples == 0) note += (note.empty() ? "" : " ") + std::string("(epoch size unrecorded)");
  const double rate = r.summary.samples_per_s;
  if ((other_epochs || other_size) && std::isfinite(rate) && rate > 0 && std::isfinite(r.summary.eval_s)) {
    // A short run's total holds its warm-up (cuDNN's autotuning, the first steps), which scaling the
    // total would multiply: the training is projected at the throughput after the warm-up
    // (--warmup-steps-excluded; where none was, the rate holds it: said), the evaluations -- the
    // run's own test set, which may be a --limit-test of the paper's: said -- scaled by the epochs.
    const double target = static_cast<double>(c.train_samples > 0 ? c.train_samples : samples);
    const std::int64_t warmup = warmup_steps_excluded(r);
    note += warmup > 0 ? fmt::format(" at its throughput after the warm-up ({} step(s))", warmup)
                       : std::string(" at its throughput, warm-up included (--warmup-steps-excluded 0)");
    if (const std::int64_t tested = r.integer("test_samples").value_or(0); r.summary.eval_s > 0 && tested > 0) {
      note += fmt::format(", its evaluation of {} test samples scaled by the epochs", tested);
    }
    return {static_cast<double>(c.epochs) * target / rate + r.summary.eval_s * epoch_scale, true, note};
  }
  return {r.summary.total_s * scale, other_epochs || other_size, note};
}

/// Where an estimate comes from, the lesser last.
enum class Source { kNone, kMeasured, kProjected, kPredicted };

std::string source_name(Source s) {
  switch (s) {
    case Source::kMeasured:
      return "measured";
    case Source::kProjected:
      return "projected";
    case Source::kPredicted:
      return "predicted";
    case Source::kNone:
      break;
  }
  return "not run";
}

/// The median of a quantity over the runs of a cell's variant.
struct Estimate {
  double value = results::kNaN;
  Source source = Source::kNone;
  std::vector<std::string> runs;   // their ids
  std::vector<std::string> notes;  // distinct
};

/// The measured runs' median, else (not for accuracy: a prediction has none) the predicted runs'.
Estimate estimate(const PaperCell& c, const Variant& v, PaperQuantity q, const std::vector<results::RunRecord>& runs) {
  for (const bool predicted : {false, true}) {
    if (predicted && q == PaperQuantity::kTestAccuracy) break;
    Estimate e;
    std::vector<double> values;
    bool projected = false;
    for (const auto& r : runs) {
      if (is_prediction_run(r) != predicted || !matches(c, r) || variant_of(r) != v) continue;
      const RunValue x = run_value(c, r, q);
      if (!std::isfinite(x.value)) continue;
      values.push_back(x.value);
      e.runs.push_back(r.run_id);
      projected = projected || x.projected;
      if (!x.note.empty() && std::find(e.notes.begin(), e.notes.end(), x.note) == e.notes.end()) {
        e.notes.push_back(x.note);
      }
    }
    if (values.empty()) continue;
    e.value = median(std::move(values));
    e.source = predicted ? Source::kPredicted : projected ? Source::kProjected : Source::kMeasured;
    return e;
  }
  return {};
}

/// The cell and variant a ratio metric divides by, and its name in notes.
struct Baseline {
  PaperCell cell;
  Variant variant;
  std::string name;
};

Baseline baseline_of(const PaperCell& c, const Variant& v, PaperBaseline b) {
  Baseline out{c, v, ""};
  switch (b) {
    case PaperBaseline::kOneGpu:
      out.cell.gpus = 1;
      out.name = "1 GPU";
      break;
    case PaperBaseline::kFp64:
      out.cell.precision = "FP64";
      out.variant.precision = "fp64";
      out.name = "FP64";
      break;
    case PaperBaseline::kPinFalse:
      out.cell.pin_memory = "false";
      out.name = "pin_memory false";
      break;
    case PaperBaseline::kNone:
      break;
  }
  return out;
}

/// The cell's row for the runs of one variant.
PaperRow variant_row(const PaperCell& c, const PaperMetric& m, const Variant& v,
                     const std::vector<results::RunRecord>& runs) {
  PaperRow row{&c, variant_text(c, v), v.card, results::kNaN, "", {}, ""};
  Estimate e = estimate(c, v, m.quantity, runs);
  row.runs = e.runs;
  if (e.source == Source::kNone) {
    row.kind = source_name(e.source);
    row.note = m.quantity == PaperQuantity::kTestAccuracy
                   ? "no run with a test accuracy (predictions and runs without an evaluation have none)"
                   : fmt::format("no run with a finite {}", c.metric);
    return row;
  }
  if (m.baseline == PaperBaseline::kNone) {
    row.mgbench = e.value;
  } else {
    const Baseline b = baseline_of(c, v, m.baseline);
    const Estimate base = estimate(b.cell, b.variant, m.quantity, runs);
    if (base.source == Source::kNone) {
      row.kind = source_name(Source::kNone);
      row.note = fmt::format("no run of the baseline, {} ({}); this setting has {} run(s)", b.name,
                             variant_text(b.cell, b.variant), row.runs.size());
      row.runs.clear();
      return row;
    }
    row.mgbench = m.quantity == PaperQuantity::kTimeRatio ? 100.0 * base.value / e.value
                                                          : 100.0 * (base.value - e.value) / base.value;
    e.source = std::max(e.source, base.source);
    e.notes.insert(e.notes.begin(), fmt::format("baseline {}: {} run(s)", b.name, base.runs.size()));
    for (const auto& note : base.notes) {
      if (std::find(e.notes.begin(), e.notes.end(), note) == e.notes.end()) e.notes.push_back("baseline " + note);
    }
  }
  row.kind = source_name(e.source);
  row.note = fmt::format("{}", fmt::join(e.notes, "; "));
  return row;
}

/// Why a cell has no run: its setting, with the precisions mgbench would run for it.
std::string not_run_note(const PaperCell& c) {
  const auto precisions = paper_precision_runs(c.precision);
  return precisions.empty()
             ? "no completed run of this setting"
             : fmt::format("no completed run of this setting (mgbench precision {})", fmt::join(precisions, " or "));
}

std::vector<PaperRow> cell_rows(const PaperCell& c, const std::vector<results::RunRecord>& runs) {
  if (!c.not_reproducible.empty()) {
    return {PaperRow{&c, "", "", results::kNaN, "not reproducible: " + c.not_reproducible, {}, c.note}};
  }
  const PaperMetric& m = *find_paper_metric(c.metric);  // parse_paper_values() checked it
  std::vector<Variant> variants;
  for (const auto& r : runs) {
    if (!matches(c, r)) continue;
    Variant v = variant_of(r);
    if (std::find(variants.begin(), variants.end(), v) == variants.end()) variants.push_back(std::move(v));
  }
  std::vector<PaperRow> rows;
  for (const Variant& v : variants) rows.push_back(variant_row(c, m, v, runs));
  if (rows.empty()) rows.push_back(PaperRow{&c, "", "", results::kNaN, "not run", {}, not_run_note(c)});
  return rows;
}

/// The paper's setting as the table says it: "2 GPU FP32 pin=false"; LLM cells with their recipe,
/// model, dataset and batch.
std::string paper_setting(const PaperCell& c) {
  std::vector<std::string> parts;
  if (c.gpus > 0) parts.push_back(fmt::format("{} GPU", c.gpus));
  if (!c.precision.empty()) parts.push_back(c.precision);
  if (!c.pin_memory.empty()) parts.push_back("pin=" + c.pin_memory);
  if (c.image_size > 0) parts.push_back(fmt::format("{} px", c.image_size));
  if (c.task == "llm") {
    for (const std::string* field : {&c.recipe, &c.model, &c.dataset}) {
      if (!field->empty()) parts.push_back(*field);
    }
  }
  if (c.batch > 0) parts.push_back(fmt::format("batch {}", c.batch));
  return fmt::format("{}", fmt::join(parts, " "));
}

/// A value with the decimals its size needs: none from 1000 on, 1 from 100 on, 2 from 10 on, else 3;
/// "-" for NaN.
std::string value_text(double v) {
  const double a = std::abs(v);
  return number(v, a >= 1000 ? 0 : a >= 100 ? 1 : a >= 10 ? 2 : 3);
}

/// The card as one table cell: the GPU model without its memory and compute capability and without
/// "NVIDIA ", a CPU's model cut to 20 characters; spaces as '-'.
std::string card_cell(const std::string& card) {
  if (card.empty()) return "-";
  std::string cell = card.starts_with("CPU") ? card.substr(0, 20) : card.substr(0, card.find(", "));
  if (cell.starts_with("NVIDIA ")) cell.erase(0, 7);
  std::replace(cell.begin(), cell.end(), ' ', '-');
  return cell;
}

}  // namespace

double PaperRow::ratio() const {
  return cell != nullptr && std::isfinite(mgbench) && cell->value != 0 ? mgbench / cell->value : results::kNaN;
}

std::vector<PaperRow> paper_rows(const std::vector<PaperCell>& cells, const std::vector<results::RunRecord>& runs) {
  std::vector<PaperRow> rows;
  for (const PaperCell& c : cells) {
    for (PaperRow& row : cell_rows(c, runs)) rows.push_back(std::move(row));
  }
  return rows;
}

void print_paper_rows(std::ostream& out, const std::vector<PaperRow>& rows, bool csv) {
  using R = PaperRow;
  auto field = [](std::string PaperCell::*f) { return [f](const R& r) { return r.cell->*f; }; };
  // The table's kind stops before ':'; the why of `not reproducible: <why>` is its note there.
  auto split = [](const R& r) { return r.kind.find(':'); };
  const std::vector<Column<R>> columns = {
      {"paper", "", -10, "paper", field(&PaperCell::paper)},
      {"table", "", -7, "table", field(&PaperCell::table)},
      {"", "", 0, "source", field(&PaperCell::source)},
      {"line", "", 4, "line", [](const R& r) { return std::to_string(r.cell->line); }},
      {"setting", "", -62, "setting",
       [](const R& r) { return paper_setting(*r.cell) + (r.setting.empty() ? "" : " [" + r.setting + "]"); },
       [](const R& r) { return paper_setting(*r.cell); }},
      {"", "", 0, "mgbench_setting", [](const R& r) { return r.setting; }},
      {"metric", "", -31, "metric", field(&PaperCell::metric)},
      {"unit", "", -4, "unit", field(&PaperCell::unit)},
      {"paper", "(unit)", 9, "paper_value", [](const R& r) { return value_text(r.cell->value); },
       [](const R& r) { return fmt::format("{:.6g}", r.cell->value); }},
      {"mgbench", "(unit)", 9, "mgbench_value", [](const R& r) { return value_text(r.mgbench); },
       [](const R& r) { return std::isfinite(r.mgbench) ? fmt::format("{:.6g}", r.mgbench) : ""; }},
      {"ratio", "", 6, "ratio", [](const R& r) { return number(r.ratio(), 3); },
       [](const R& r) { return std::isfinite(r.ratio()) ? fmt::format("{:.4f}", r.ratio()) : ""; }},
      {"card", "", -20, "card", [](const R& r) { return card_cell(r.card); }, [](const R& r) { return r.card; }},
      {"kind", "", -16, "kind", [&](const R& r) { return r.kind.substr(0, split(r)); },
       [](const R& r) { return r.kind; }},
      {"n", "", 3, "n", [](const R& r) { return std::to_string(r.runs.size()); }},
      {"", "", 0, "runs", [](const R& r) { return fmt::format("{}", fmt::join(r.runs, " ")); }},
      {"note", "", 0, "note",
       [&](const R& r) { return split(r) == std::string::npos ? r.note : r.kind.substr(split(r) + 2); },
       [](const R& r) { return r.note; }},
  };
  if (!csv) {
    out << "# PAPER CELLS (mgbench report --paper): Lawenda et al. 2025 (arXiv 2503.15252) Tables 2, 3 (MobileNetV2 "
           "on MNIST upscaled) and 5 (Llama-3-8B LoRA on alpaca-cleaned), each cell at its line of "
           "../shared/papers/<source>, and 2505.22905's headline figures (only an unverified summary states them), "
           "beside mgbench at the same setting\n"
           "# setting: the paper's (several GPUs: ddp-ds); [...]: what mgbench ran where the paper leaves it open "
           "(image size, batch) or names it otherwise: the paper's FP32 is PyTorch's default (cuDNN convolutions on "
           "TF32), mgbench's strict fp32 and its tf32 each in rows of their own\n"
           "# mgbench: the median over the n completed runs of the setting; projected: to the paper's epochs and "
           "samples per epoch, at the throughput after the warm-up where recorded (else total_s scaled); predicted: "
           "mgbench predict's runs, for GPU counts not measured; "
           "ratio = mgbench / paper\n";
  }
  write_table(out, columns, rows, csv);
}

void print_paper(std::ostream& out, const std::vector<results::RunRecord>& runs, bool csv) {
  print_paper_rows(out, paper_rows(paper_values(), runs), csv);
}

}  // namespace mgbench::report
