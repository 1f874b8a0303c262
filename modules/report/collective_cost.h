#pragma once
// What a collective costs at a rank count, as `mgbench predict` prices communication: from the rows
// of a `mgbench comm` run (interpolated between measured sizes), or from a labelled link assumption
// with nccl-tests' bus factors. Torch-free.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "results/reader.h"

namespace mgbench::report {

/// A link assumption where no comm run was measured at a rank count: latency + size x the
/// collective's bus factor (axes/bus_bandwidth.h: nccl-tests') / busbw. Labelled as assumptions
/// wherever used.
struct LinkAssumption {
  std::string name;    // as typed: h100-nvlink
  double latency_s;    // per collective
  double busbw_gbs;    // bus bandwidth [GB/s, 1e9]
  std::string source;  // where the figure comes from
};
const std::vector<LinkAssumption>& link_assumptions();
/// The assumption named `name`, or nullptr.
const LinkAssumption* find_link(const std::string& name);
/// Their names, "h100-nvlink or h100-pcie" (for help and messages).
std::string link_names();
/// The assumption named `name`; throws ConfigError "--link '<name>': expected ..." listing the names.
const LinkAssumption& link_assumption(const std::string& name);

/// One collective's time by message size at one rank count and node count (the ranks spread over
/// `nodes` nodes: a comm run's `nodes`), from a comm run's out-of-place rows of one dtype (time
/// averaged over ranks), or from a link assumption. Sizes as nccl-tests counts them
/// (and `mgbench comm` records them): an all-reduce's buffer, an all-gather's gathered output, a
/// reduce-scatter's input.
class CollectiveCost {
 public:
  /// collective: all-reduce, all-gather or reduce-scatter; points: (bytes, seconds), any order, at
  /// least one; source: what they come from.
  CollectiveCost(std::string collective, int world_size, std::vector<std::pair<double, double>> points,
                 std::string source, int nodes = 1);
  CollectiveCost(std::string collective, int world_size, const LinkAssumption& link, int nodes = 1);
  /// Seconds for one collective of `bytes`: interpolated linearly in log(bytes)-log(time) between
  /// measured sizes; below the smallest, its time; above the largest, its time plus the extra bytes
  /// at the largest size's algorithm bandwidth. 0 at one rank.
  double seconds(double bytes) const;
  const std::string& collective() const { return collective_; }
  int world_size() const { return world_size_; }
  int nodes() const { return nodes_; }
  const std::string& source() const { return source_; }

 private:
  std::string collective_;
  int world_size_;
  int nodes_ = 1;
  std::vector<std::pair<double, double>> points_;  // sorted by bytes
  std::optional<LinkAssumption> link_;
  std::string source_;
};

/// The costs of one collective of the completed comm runs in `runs` on `device` (cpu, cuda): their
/// out-of-place rows of this dtype (sum where it reduces), by world size and node count (the latest
/// run of each pair wins).
std::vector<CollectiveCost> collective_costs(const std::vector<results::RunRecord>& runs, const std::string& collective,
                                             const std::string& dtype, const std::string& device);

/// The measured costs a prediction prices its communication with, each by world size and nodes.
struct CommCosts {
  std::vector<CollectiveCost> all_reduce;      // DDP's gradient buckets
  std::vector<CollectiveCost> all_gather;      // FSDP's unit gathers
  std::vector<CollectiveCost> reduce_scatter;  // FSDP's gradient reduce-scatters
  std::vector<CollectiveCost> broadcast;       // DDP's buffer broadcasts
};

}  // namespace mgbench::report
