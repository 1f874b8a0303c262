#pragma once
// `mgbench report --paper`: every cell of the papers' tables beside mgbench's value for the same
// setting. The cells are python/mgbench_analysis/paper_values.csv (one row per printed number, with the line of
// the paper's text that prints it; python/mgbench_analysis/paper_values.md), built into the binary at build time
// (cmake/EmbedText.cmake, as the recipes' configurations are): Lawenda et al. 2025 (arXiv
// 2503.15252), Tables 2 and 3 (MobileNetV2 on MNIST upscaled, 1-4 GPUs, FP64 / FP32 / FP16,
// pin_memory) and Table 5 (Llama-3-8B LoRA, s/it, pin_memory), and the headline figures of
// 2505.22905, which only an unverified AI-written summary states (our copy of that paper is its
// abstract: it has no table to compare with). paper_values.cpp reads the cells, paper_table.cpp
// matches them with the runs.
#include <cstdint>
#include <ostream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "results/reader.h"

namespace mgbench::report {

/// One number a paper prints: where, at which setting, and what it measures. A setting field left
/// empty (0 for the numbers) is one the paper does not state: a run's value of it does not matter.
struct PaperCell {
  std::string paper;               // arXiv id: "2503.15252", "2505.22905"
  std::string table;               // "Table 2", "Table 3", "Table 5"; "Summary": not a table of the paper
  std::string source;              // the text it is read from, a file of ../shared/papers/
  std::int64_t line = 0;           // 1-based line of `source` that prints it
  std::string as_printed;          // the number as that line prints it: "6 266", "187.66%", "5:31:52", "0,04%"
  std::string task;                // image | llm
  std::int64_t gpus = 0;           // GPUs: mgbench's world_size
  std::string strategy;            // with several GPUs: mgbench's strategy (ddp-ds)
  std::string precision;           // the paper's: FP64, FP32, FP16 (paper_precision_runs())
  std::string pin_memory;          // true | false
  std::int64_t image_size = 0;     // px
  std::string model;               // mobilenet_v2; llama3-8b: any model shaped like Llama 3 8B
  std::string recipe;              // classification, lora, ...
  std::string dataset;             // mgbench's name: mnist, alpaca (alpaca-cleaned)
  std::int64_t batch = 0;          // per GPU
  std::int64_t epochs = 0;         // of the paper's run
  std::int64_t train_samples = 0;  // in one epoch of the paper's run (MNIST 60,000; alpaca-cleaned 51,760 rows)
  std::string metric;              // a paper_metrics() name (any name where not_reproducible says why)
  double value = 0;                // in `unit`
  std::string unit;                // s, %, s/it
  std::string not_reproducible;    // why mgbench cannot reproduce the cell; "" when it can
  std::string note;                // where the setting comes from, what the paper's number means
};

/// How mgbench obtains a metric from its runs.
enum class PaperQuantity {
  kTotalTime,        // total_s, projected to the paper's epochs and epoch size where a run had others [s]
  kTestAccuracy,     // the summary's test accuracy [%]
  kSPerIt,           // the summary's s_per_it [s/it]
  kTimeRatio,        // 100 x kTotalTime(baseline) / kTotalTime(the cell) [%]
  kTimeImprovement,  // 100 x (kTotalTime(baseline) - kTotalTime(the cell)) / kTotalTime(baseline) [%]
};

/// The setting a ratio metric divides by: the cell's, but for one field.
enum class PaperBaseline {
  kNone,      // not a ratio
  kOneGpu,    // gpus = 1
  kFp64,      // precision = FP64 (mgbench's fp64)
  kPinFalse,  // pin_memory = false
};

/// A metric the cells may name.
struct PaperMetric {
  std::string_view name;   // the cells' `metric`
  PaperQuantity quantity;  // how mgbench obtains it
  PaperBaseline baseline;  // kTimeRatio, kTimeImprovement: what they divide by
  std::string_view unit;   // the cells' `unit`
};

/// Every metric mgbench can put beside a cell.
std::span<const PaperMetric> paper_metrics();

/// The metric called `name`; nullptr when there is none.
const PaperMetric* find_paper_metric(std::string_view name);

/// mgbench's precisions that stand for a paper's, in the order their rows are shown: FP64 -> fp64,
/// FP16 -> fp16, FP32 -> fp32 and tf32 (the paper's FP32 is PyTorch's default, which lets cuDNN run
/// convolutions on TF32 and keeps cuBLAS's matmuls strict: mgbench's fp32 is strict, its tf32 allows
/// both, and each has rows of its own); empty for any other name.
std::vector<std::string_view> paper_precision_runs(std::string_view paper_precision);

/// A number as a paper prints it, in its own unit: spaces as thousands separators ("6 266" -> 6266),
/// a decimal comma ("0,04%" -> 0.04), a trailing '%' dropped ("187.66%" -> 187.66), h:mm:ss and m:ss
/// as seconds ("5:31:52" -> 19912). NaN for any other text.
double paper_number(std::string_view as_printed);

/// The cells of a CSV text in paper_values.csv's columns (python/mgbench_analysis/paper_values.md; a header row, any
/// column order, RFC 4180 quoting). `name` names the text in errors. Throws DataError naming it, the
/// CSV line and the column for malformed CSV, a missing column, a row of another field count, a
/// number that is not one, a task, precision, pin_memory or metric mgbench does not know (a metric
/// may be unknown where not_reproducible says why), a unit other than the metric's, a time metric
/// without GPUs or epochs, or a value that is not what as_printed reads (paper_number()).
std::vector<PaperCell> parse_paper_values(std::string_view csv_text, std::string_view name);

/// The built-in cells: python/mgbench_analysis/paper_values.csv as the build embedded it, parsed once. Throws
/// what parse_paper_values() throws (a test checks the shipped file).
const std::vector<PaperCell>& paper_values();

/// One row of the comparison: a cell and what mgbench measured (or predicted) at its setting on one
/// kind of run (one mgbench precision, image size, batch, ... and card).
struct PaperRow {
  const PaperCell* cell = nullptr;
  std::string setting;            // what mgbench ran where the paper leaves it open or names it otherwise
                                  // ("tf32, 500 px, batch 64, upscale device"); "" when nothing ran
  std::string card;               // the runs' gpu_model, else "CPU: <cpu_model>"; "" when nothing ran
  double mgbench = 0;             // the median over the runs, in the cell's unit; NaN without one
  std::string kind;               // measured | projected | predicted | not run | not reproducible: <why>
  std::vector<std::string> runs;  // the run ids the median is over (n = their number)
  std::string note;               // how: the projection, the baseline's runs, why nothing matched

  /// mgbench / paper; NaN without both.
  double ratio() const;
};

/// The rows of `cells` against `runs` (results::read_runs; measured runs and `mgbench predict`'s
/// runs of task prediction), in the cells' order. A cell matches the completed runs on one node
/// (not dp: one process over all GPUs) whose attributes equal its setting: task (a prediction's
/// predicted_task), world_size = gpus, the strategy with several GPUs, precision
/// (paper_precision_runs()), pin_memory, and where stated image_size, batch_size, model
/// (mobilenet_v2 at width 1; llama3-8b: 8.03e9 parameters +-1 %, or a Llama 3 8B name), recipe and
/// dataset. The matching runs make one row per distinct mgbench precision, image size, batch,
/// gradient accumulation, upscale and card; a cell without any makes one `not run` row, one that
/// mgbench cannot reproduce one `not reproducible` row. Per row: the measured runs' median (time
/// metrics `projected` where a run had another epoch count or epoch size than the paper's: the
/// paper's epochs x its samples per epoch / the run's throughput after its warm-up (samples_per_s,
/// --warmup-steps-excluded) + the run's eval_s x the paper's epochs / the run's; without a
/// throughput, total_s / epochs x the paper's epochs x the paper's samples per epoch / the run's), else for time and
/// s/it the predicted runs' median (`predicted`); ratio metrics pair it with the baseline's median
/// of the same row kind (their kind the lesser of both: measured, projected, predicted).
std::vector<PaperRow> paper_rows(const std::vector<PaperCell>& cells, const std::vector<results::RunRecord>& runs);
/// The rows point at the cells: not a temporary.
std::vector<PaperRow> paper_rows(std::vector<PaperCell>&& cells, const std::vector<results::RunRecord>& runs) = delete;

/// The rows as a table ('#' metadata, header and units rows, data rows; as the report's other tables)
/// or as CSV: paper, table, source, line, setting, mgbench_setting, metric, unit, paper_value,
/// mgbench_value, ratio, card, kind, n, runs, note.
void print_paper_rows(std::ostream& out, const std::vector<PaperRow>& rows, bool csv);

/// `mgbench report --paper`: print_paper_rows() of paper_rows(paper_values(), runs).
void print_paper(std::ostream& out, const std::vector<results::RunRecord>& runs, bool csv);

}  // namespace mgbench::report
