#pragma once
// What the readers derive from a run's steps tables without holding their rows: rank 0's first
// steps (the warm-up `mgbench predict` reads), the ranks' per-step skew (stragglers) and rank 0's
// steps by their use of CUDA graphs (`mgbench report --cuda`).
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "results/schema.h"

namespace mgbench::results {

/// How many of rank 0's first steps a RunRecord holds (first_step_s).
inline constexpr std::size_t kFirstSteps = 16;

/// A rank's step as the readers take it: one row of its steps table.
struct StepTime {
  std::int32_t epoch = -1;                     // -1: an unwritten row
  double step_s = 0;                           // the step's wall time [s]
  double collective_s = 0;                     // of it in the collectives (results::collective_s) [s]
  std::int8_t cuda_graph = kGraphNotRecorded;  // StepRecord::cuda_graph
};

/// The first kFirstSteps of `rows`' step times [s], while they are of the first written epoch.
std::vector<double> first_step_s(const std::vector<StepTime>& rows);

/// Synchronous ranks wait for the slowest at every step: over the step rows that every rank of a run
/// wrote, the sums of the slowest rank's own time and of the ranks' mean own time [s] (own: step_s
/// less collective_s, the rank's work), and the rows' count. slowest_s / mean_s is the factor by
/// which the ranks' steps last longer than their mean work; it is larger than the same ratio of
/// epoch totals, where the ranks' per-step differences cancel. 0 rows at 1 rank.
struct StepSkew {
  double slowest_s = 0, mean_s = 0;
  std::int64_t steps = 0;
};

/// StepSkew, one rank's rows at a time (a run's ranks in order, rows aligned by index: row i is the
/// same step on every rank); holds three numbers a row, not the ranks' rows.
class StepSkewSum {
 public:
  void add_rank(const std::vector<StepTime>& rows);
  StepSkew result() const;

 private:
  std::vector<double> slowest_, sum_;
  std::vector<int> ranks_;  // how many ranks wrote the row
  int added_ = 0;
};

/// One rank's written steps by StepRecord::cuda_graph (kGraphEager ... kGraphMixed): how many, and
/// their wall time [s]. recorded() is false for a run before schema 15 (no row says).
struct GraphSteps {
  std::array<std::int64_t, kGraphKinds> steps{};
  std::array<double, kGraphKinds> seconds{};
  std::int64_t not_recorded = 0;  // written rows without the field
  bool recorded() const { return not_recorded == 0 && (steps[0] + steps[1] + steps[2] + steps[3]) > 0; }
  /// Mean wall time [s] of the steps of `kind`; NaN where there are none.
  double mean_s(std::int8_t kind) const;
};

/// GraphSteps of one rank's rows (unwritten rows, epoch -1, left out).
GraphSteps graph_steps(const std::vector<StepTime>& rows);

}  // namespace mgbench::results
