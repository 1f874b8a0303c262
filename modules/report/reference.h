#pragma once
// `mgbench report --reference REF --tolerance PCT FILES`: the regression check of a nightly job.
// Each workload of FILES beside the reference's runs of the same workload (report/workload.h's
// identity, and the same ranks, nodes, strategy and backend), metric by metric: the median over each
// side's runs, their ratio, and a verdict against the tolerance. ReFrame's performance references
// work alike (a reference value with lower / upper bounds per system partition).
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "results/reader.h"

namespace mgbench::report {

enum class Verdict { kHolds, kImproved, kRegressed, kFailed };

/// One metric of one workload beside the reference's.
struct ReferenceRow {
  std::string run;            // the latest run of FILES in the group (or the failed one)
  std::string reference_run;  // the latest reference run of the group
  std::string workload;       // a short, whitespace-free reading: image "fp32/224px/ddp", LLM "lora/bf16/2x8"
  std::int64_t ranks = 0;
  std::string hardware;  // report/workload.h hardware_cell()
  std::string metric;    // "img/s", "s/epoch", "tokens/s", "s/it", "peak MiB", "busbw <collective> <dtype>"
  bool higher_is_better = true;
  double reference = 0;  // median over the reference runs of the group
  double measured = 0;   // median over the runs of FILES in the group; NaN for a failed run
  std::size_t reference_runs = 0;
  std::size_t measured_runs = 0;
  double ratio = 0;  // measured / reference
  Verdict verdict = Verdict::kHolds;
};

struct ReferenceCheck {
  std::vector<ReferenceRow> rows;
  std::vector<std::string> notes;  // runs with no reference of their workload, runs that did not complete
  bool any_regressed() const;      // a row kRegressed
  bool any_failed() const;         // a row kFailed: a run of either side that did not complete
  /// `report --reference`'s exit status: 2 a run did not complete (nothing of it can be judged), 1 a
  /// metric regressed, 0 every metric holds or improved.
  int exit_status() const;
};

/// One metric of a completed run.
struct RunMetric {
  std::string
      metric;  // "img/s", "s/epoch", "tokens/s", "s/it", "peak_MiB", "busbw:<collective>:<dtype>:<placement>:<bytes>B"
  bool higher_is_better = true;
  double value = 0;
};

/// The metrics a run is compared and summarised by, finite and positive values only, in a fixed
/// order: image runs img/s, s/epoch (total time / epochs) and peak memory; LLM runs tokens/s, s/it
/// and peak memory; comm runs busbw per collective, dtype and placement at the run's largest size.
std::vector<RunMetric> run_metrics(const results::RunRecord& run);

/// What runs are compared and pooled as: the workload identity and the same ranks, nodes, strategy,
/// backend and warm-up steps excluded from the throughput (0 for runs written before it existed).
std::string comparison_group(const results::RunRecord& run);

/// The settings a reader tells rows apart by, whitespace-free: image "fp32/224px/ddp", LLM
/// "lora/bf16/2x8", comm "nccl".
std::string short_workload(const results::RunRecord& run);

/// The median of a non-empty list.
double median(std::vector<double> values);

/// Of repeated runs, the one of median total time (summary.total_s): the middle one, of an even
/// number the faster of the middle two (a run, not a mean of two); nullptr for none. `predict`
/// builds on it and its table compares with it, as the report's efficiencies take the median time.
const results::RunRecord* median_run(std::vector<const results::RunRecord*> runs);

/// Compares `runs` (FILES) with `reference` (REF). One rule for every metric: its slowdown -- the
/// ratio measured / reference of a lower-is-better metric (s/epoch, s/it, peak MiB), the inverse of a
/// higher-is-better one (img/s, tokens/s, busbw) -- regresses above 1 + `tolerance` (a fraction: 0.1
/// = 10 % slower, so img/s below reference / 1.1, s/epoch above 1.1 x reference) and improves below
/// 1 / (1 + tolerance). A run of either side that did not complete (failed, aborted, preempted,
/// running) is a row of its own, metric "status", verdict kFailed, and a note with its error.
/// Predicted runs (`mgbench predict`'s, in either list) are left out, with a note.
/// Metrics: run_metrics(), where both sides have them (a comm run's largest size must be the
/// reference's).
ReferenceCheck compare_to_reference(const std::vector<results::RunRecord>& reference,
                                    const std::vector<results::RunRecord>& runs, double tolerance);

/// The check as a table (nccl-tests' layout: '#' metadata, header and units rows; data rows; '#'
/// notes) or CSV.
void print_reference(std::ostream& out, const ReferenceCheck& check, const std::string& reference_path,
                     double tolerance, bool csv);

/// "holds", "improved", "REGRESSED", "FAILED".
const char* to_string(Verdict verdict);

}  // namespace mgbench::report
