#pragma once
// Stragglers of a multi-rank run: the ranks whose own time -- training time outside the step's
// collectives (allreduce, buffer_broadcast, loss_reduce phases), where the faster ranks wait for the
// slower -- exceeds the other ranks' median by more than a stated margin, with the host, the GPU and
// the phase that makes the difference. Synchronous ranks end each step together, so the step times
// cannot name the slow one; the time outside the collectives can. Torch-free.
#include <ostream>
#include <string>
#include <vector>

#include "results/reader.h"

namespace mgbench::report {

/// Relative excess over the other ranks' median own time that makes a straggler.
inline constexpr double kStragglerMargin = 0.20;

struct Straggler {
  int rank = 0;
  std::string host;            // rank attribute hostname ("" where absent)
  std::string gpu;             // rank attribute gpu_pci_bus_id ("" on the CPU)
  double own_s = 0;            // train_s minus the collective phases, summed over the run's epochs [s]
  double others_median_s = 0;  // the other ranks' median of the same [s]
  std::string
      phase;  // the phase (data, h2d, transform, forward, backward, optimizer, other) most above the others' median
  double phase_excess_s = 0;  // by how much [s]
};

/// The stragglers of `run` (none for one rank or no completed epoch), slowest first.
std::vector<Straggler> find_stragglers(const results::RunRecord& run, double margin = kStragglerMargin);

/// One `#` line per straggler of each multi-rank run ("# straggler: rank 1 (host, GPU ...) ..."),
/// or nothing.
void print_stragglers(std::ostream& out, const results::RunRecord& run);

}  // namespace mgbench::report
