#pragma once
// The workload identity: which runs are the same workload (what is computed, on what device and
// GPU model), from the one attribute list python/mgbench_analysis/workload_identity.txt that
// mgbench_analysis reads too. Efficiencies and `report --reference` pair only runs of one identity.
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "results/reader.h"

namespace mgbench::report {

/// The identity's attribute names, in the list's order.
std::span<const std::string_view> workload_attributes();

/// A run's value of an identity attribute, as `mgbench report` prints it: the attribute's display
/// text, "" where the run lacks it, and for `recipe` the job's only recipe of the time for runs
/// written before recipes were recorded.
std::string workload_value(const results::RunRecord& run, std::string_view attribute);

/// The run's identity: "name=value" of every attribute, joined by ';'. `overrides` replaces the
/// run's values of the attributes it names (e.g. {{"precision", "fp64"}} finds the fp64 peer).
std::string workload_identity(const results::RunRecord& run, const std::map<std::string, std::string>& overrides = {});

/// An identity attribute in which two runs differ.
struct WorkloadDifference {
  std::string attribute;
  std::string a;  // run a's value ("" where it lacks one)
  std::string b;
};

/// Where runs a and b differ among the identity's attributes (empty: the same workload), in the
/// list's order; `overrides` applies to a's values as in workload_identity().
std::vector<WorkloadDifference> workload_differences(const results::RunRecord& a, const results::RunRecord& b,
                                                     const std::map<std::string, std::string>& overrides = {});

/// "gpu_model 'NVIDIA H100' vs 'NVIDIA A100', device ..." -- at most `limit` differences, then "...".
std::string describe(const std::vector<WorkloadDifference>& differences, std::size_t limit = 3);

/// Where a run ran: the GPU model where recorded ("NVIDIA H100 80GB HBM3, 79.2 GiB, sm_90"), else the device kind
/// ("cpu", "cuda"), else "-".
std::string hardware(const results::RunRecord& run);

/// hardware() as one whitespace-free table cell: the model only (up to the first ", "), "NVIDIA "
/// dropped, spaces as '-': "NVIDIA H100 80GB HBM3, 79.2 GiB, sm_90" -> "H100-80GB-HBM3".
std::string hardware_cell(const results::RunRecord& run);

/// Why `run` has no 1-rank baseline among `runs` (multi-rank, completed): "no 1-rank run of this
/// workload on <hardware>" and the nearest 1-rank run of its task with the identity attributes it
/// differs in; "" where it has one, or is a 1-rank run, or nothing of its task ran on 1 rank.
std::string baseline_note(const results::RunRecord& run, const std::vector<results::RunRecord>& runs);

}  // namespace mgbench::report
