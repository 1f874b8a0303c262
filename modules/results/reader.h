#pragma once
// Serial reader of mgbench results files (no MPI needed): what `mgbench report` reads.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "results/hdf5.h"
#include "results/schema.h"
#include "results/step_times.h"

namespace mgbench::results {

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
  GraphSteps graph_steps;                                   // rank 0's steps by their CUDA graphs
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
