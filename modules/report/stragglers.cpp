#include "report/stragglers.h"

#include <algorithm>

#include <fmt/format.h>

namespace mgbench::report {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// A rank's time by the phases that are its own work, and "other" (the rest outside collectives).
struct OwnTimes {
  double own = 0;
  std::vector<std::pair<const char*, double>> phases;
};

OwnTimes own_times(const std::vector<results::EpochRecord>& epochs) {
  OwnTimes t;
  for (std::size_t k = 0; k < std::size(results::kPhaseFields); ++k) {
    if (!results::is_collective(static_cast<results::Phase>(k)))
      t.phases.emplace_back(results::kPhaseFields[k].name, 0.0);
  }
  double listed = 0;
  for (const auto& e : epochs) {
    t.own += e.train_s - results::collective_s(e.phases);
    std::size_t j = 0;
    for (std::size_t k = 0; k < std::size(results::kPhaseFields); ++k) {
      if (results::is_collective(static_cast<results::Phase>(k))) continue;
      const double seconds = e.phases.*results::kPhaseFields[k].seconds;
      t.phases[j++].second += seconds;
      listed += seconds;
    }
  }
  t.phases.emplace_back("other", std::max(0.0, t.own - listed));
  return t;
}

}  // namespace

std::vector<Straggler> find_stragglers(const results::RunRecord& run, double margin) {
  std::vector<OwnTimes> ranks;
  for (const auto& epochs : run.epochs) {
    if (epochs.empty()) return {};  // a rank without a completed epoch: nothing to compare
    ranks.push_back(own_times(epochs));
  }
  std::vector<Straggler> out;
  if (ranks.size() < 2) return out;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    std::vector<double> others;
    for (std::size_t q = 0; q < ranks.size(); ++q) {
      if (q != r) others.push_back(ranks[q].own);
    }
    const double reference = median(others);
    if (!(ranks[r].own > (1.0 + margin) * reference)) continue;
    Straggler s;
    s.rank = static_cast<int>(r);
    if (r < run.rank_attributes.size()) {
      s.host = results::text_attribute(run.rank_attributes[r], "hostname").value_or("");
      s.gpu = results::text_attribute(run.rank_attributes[r], "gpu_pci_bus_id").value_or("");
    }
    s.own_s = ranks[r].own;
    s.others_median_s = reference;
    for (std::size_t k = 0; k < ranks[r].phases.size(); ++k) {
      std::vector<double> phase_others;
      for (std::size_t q = 0; q < ranks.size(); ++q) {
        if (q != r) phase_others.push_back(ranks[q].phases[k].second);
      }
      const double excess = ranks[r].phases[k].second - median(phase_others);
      if (s.phase.empty() || excess > s.phase_excess_s) {
        s.phase = ranks[r].phases[k].first;
        s.phase_excess_s = excess;
      }
    }
    out.push_back(s);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.own_s > b.own_s; });
  return out;
}

void print_stragglers(std::ostream& out, const results::RunRecord& run) {
  for (const Straggler& s : find_stragglers(run)) {
    out << fmt::format(
        "# straggler: rank {} ({}{}): {:.3f} s outside the collectives, {:+.0f} % over the other ranks' median "
        "{:.3f} s (margin {:.0f} %); most in {} ({:+.3f} s)\n",
        s.rank, s.host.empty() ? "host unknown" : s.host, s.gpu.empty() ? "" : ", GPU " + s.gpu, s.own_s,
        100.0 * (s.own_s / s.others_median_s - 1.0), s.others_median_s, 100.0 * kStragglerMargin, s.phase,
        s.phase_excess_s);
  }
}

}  // namespace mgbench::report
