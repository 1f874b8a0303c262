#pragma once
// Serial reader of mgbench results files (no MPI needed): what `mgbench report` reads.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "results/hdf5.h"
#include "results/schema.h"

namespace mgbench::results {

/// How many of rank 0's first steps a RunRecord holds (first_step_s).
inline constexpr std::size_t kFirstSteps = 16;

/// A rank's step as the straggler wait reads it: one written row of its steps table.
struct StepTime {
  std::int32_t epoch = -1;  // -1: an unwritten row
  double step_s = 0;        // the step's wall time [s]
  double collective_s = 0;  // of it in the collectives (results::collective_s) [s]
};

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

struct RunRecord {
  std::string file;    // path of the results file
  std::string run_id;  // name of the group under /runs
  h5::Attributes attributes;
  std::string status;        // running | completed | failed | preempted
  std::string error;         // message of a failed run
  std::string continued_by;  // the run of the same file that continues this one at another world size ("": none)
  RunSummary summary;
  std::vector<std::vector<EpochRecord>> epochs;  // [rank][epoch], unwritten rows dropped
  /// Rank 0's first steps' wall times [s], in order: up to kFirstSteps rows of its steps table, of its
  /// first written epoch (what `mgbench predict` reads of the warm-up a run pays once).
  std::vector<double> first_step_s;
  StepSkew step_skew;                                       // of every rank's steps table (0 rows at 1 rank)
  std::vector<h5::Attributes> rank_attributes;              // [rank]: hostname, local_rank, gpu_pci_bus_id, ...
  std::vector<CudaSummaryRecord> cuda;                      // [rank] CUDA metrics of GPU runs (empty otherwise)
  std::vector<std::vector<CudaApiRecord>> cuda_api;         // [rank], used rows only
  std::vector<std::vector<CudaKernelRecord>> cuda_kernels;  // [rank], used rows only
  std::vector<std::string> metric_names;                    // columns of the recipe's per-step metrics
  std::vector<std::vector<std::vector<double>>> metrics;    // [rank][step row][column], written rows only
  std::vector<std::vector<CommRecord>> comm;                // [rank] rows of `mgbench comm` runs, written rows only
  std::vector<EnergyRecord> energy;                         // [rank] runs with telemetry (empty otherwise)
  std::vector<std::vector<TelemetryRecord>> telemetry;      // [rank] the readings written

  /// Attribute lookups; std::nullopt when absent or of another type.
  std::optional<std::string> text(const std::string& name) const;
  std::optional<std::int64_t> integer(const std::string& name) const;
  /// A numeric attribute (double, or integer converted); std::nullopt when absent or text.
  std::optional<double> real(const std::string& name) const;
  /// Attribute as display text whatever its type ("" when absent).
  std::string display(const std::string& name) const;
};

/// The text attribute `name` of `attributes`; std::nullopt when absent or of another type.
std::optional<std::string> text_attribute(const h5::Attributes& attributes, const std::string& name);

/// Reads every run of a results file, in the file's (creation-time) order.
/// Throws ResultsError naming the file when it is missing, not HDF5, or not an mgbench file.
std::vector<RunRecord> read_runs(const std::string& path);

}  // namespace mgbench::results
