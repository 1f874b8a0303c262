#include "report/collective_cost.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "axes/bus_bandwidth.h"
#include "core/error.h"
#include "core/option_table.h"
#include "report/report.h"

namespace mgbench::report {

const std::vector<LinkAssumption>& link_assumptions() {
  // Bus bandwidths of large all-reduces as nccl-tests reports them on such machines; latencies of
  // small ones. Assumptions, not measurements: measure with `mgbench comm` on the target instead.
  static const std::vector<LinkAssumption> links = {
      {"h100-nvlink", 25e-6, 350.0,
       "H100 SXM, NVLink 4 (900 GB/s per GPU): ~350 GB/s busbw for large all-reduces within a node (nccl-tests "
       "figures commonly reported for 8x H100 HGX), ~25 us for small ones"},
      {"h100-pcie", 30e-6, 22.0,
       "H100 PCIe without NVLink bridges, PCIe Gen5 x16 (64 GB/s per direction nominal): ~22 GB/s busbw through "
       "the host bridges, ~30 us latency"},
  };
  return links;
}

const LinkAssumption* find_link(const std::string& name) {
  for (const auto& l : link_assumptions()) {
    if (l.name == name) return &l;
  }
  return nullptr;
}

std::string link_names() {
  std::vector<std::string_view> names;
  for (const auto& l : link_assumptions()) names.push_back(l.name);
  return options::join_names(names);
}

const LinkAssumption& link_assumption(const std::string& name) {
  if (const LinkAssumption* link = find_link(name)) return *link;
  options::fail("link", name, link_names());
}

CollectiveCost::CollectiveCost(std::string collective, int world_size, std::vector<std::pair<double, double>> points,
                               std::string source, int nodes)
    : collective_(std::move(collective)),
      world_size_(world_size),
      nodes_(nodes),
      points_(std::move(points)),
      source_(std::move(source)) {
  MGBENCH_REQUIRE(!points_.empty(), ResultsError, "{}: no {} rows", source_, collective_);
  std::sort(points_.begin(), points_.end());
}

CollectiveCost::CollectiveCost(std::string collective, int world_size, const LinkAssumption& link, int nodes)
    : collective_(std::move(collective)),
      world_size_(world_size),
      nodes_(nodes),
      link_(link),
      source_("assumed link " + link.name) {}

double CollectiveCost::seconds(double bytes) const {
  if (world_size_ <= 1) return 0;
  if (link_) return link_->latency_s + bytes * axes::bus_factor(collective_, world_size_) / (link_->busbw_gbs * 1e9);
  if (bytes <= points_.front().first) return points_.front().second;
  const auto& [last_bytes, last_s] = points_.back();
  if (bytes >= last_bytes) return last_s + (bytes - last_bytes) * last_s / last_bytes;
  const auto hi = std::upper_bound(points_.begin(), points_.end(), std::make_pair(bytes, 0.0));
  const auto lo = hi - 1;
  const double f = (std::log(bytes) - std::log(lo->first)) / (std::log(hi->first) - std::log(lo->first));
  return std::exp(std::log(lo->second) + f * (std::log(hi->second) - std::log(lo->second)));
}

std::vector<CollectiveCost> collective_costs(const std::vector<results::RunRecord>& runs, const std::string& collective,
                                             const std::string& dtype, const std::string& device) {
  std::map<std::pair<int, int>, CollectiveCost> by_placement;  // (ranks, nodes)
  for (const auto& r : runs) {
    // Only what measured the target: a completed comm run (its check passed) on the same device kind.
    if (r.display("task") != "comm" || r.comm.empty() || !is_completed(r) || r.display("device") != device) continue;
    std::map<double, std::pair<double, int>> sums;  // bytes -> (sum of rank means, ranks)
    for (const auto& rank : r.comm) {
      for (const auto& c : rank) {
        // The sum where the collective reduces (an all-gather records no op).
        const std::string_view op(c.op);
        if (std::string_view(c.collective) != collective || std::string_view(c.dtype) != dtype ||
            (op != "sum" && !op.empty()) || c.in_place != 0 || !std::isfinite(c.time_s)) {
          continue;
        }
        auto& s = sums[static_cast<double>(c.bytes)];
        s.first += c.time_s;
        s.second += 1;
      }
    }
    if (sums.empty()) continue;
    std::vector<std::pair<double, double>> points;
    for (const auto& [bytes, s] : sums) points.emplace_back(bytes, s.first / s.second);
    const int n = static_cast<int>(r.integer("world_size").value_or(1));
    const int nodes = static_cast<int>(std::max<std::int64_t>(r.integer("nodes").value_or(1), 1));
    by_placement.insert_or_assign(
        std::make_pair(n, nodes),
        CollectiveCost(collective, n, std::move(points), fmt::format("comm run {} ({})", r.run_id, r.file), nodes));
  }
  std::vector<CollectiveCost> out;
  for (auto& [placement, cost] : by_placement) out.push_back(std::move(cost));
  return out;
}

}  // namespace mgbench::report
