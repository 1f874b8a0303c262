#include "results/step_times.h"

#include <algorithm>

namespace mgbench::results {

std::vector<double> first_step_s(const std::vector<StepTime>& rows) {
  std::vector<double> out;
  for (const StepTime& row : rows) {
    if (out.size() == kFirstSteps || row.epoch < 0 || row.epoch != rows.front().epoch) break;
    out.push_back(row.step_s);
  }
  return out;
}

void StepSkewSum::add_rank(const std::vector<StepTime>& rows) {
  if (rows.size() > slowest_.size()) {
    slowest_.resize(rows.size(), 0.0);
    sum_.resize(rows.size(), 0.0);
    ranks_.resize(rows.size(), 0);
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].epoch < 0) continue;
    const double own = rows[i].step_s - rows[i].collective_s;
    slowest_[i] = ranks_[i] == 0 ? own : std::max(slowest_[i], own);
    sum_[i] += own;
    ++ranks_[i];
  }
  ++added_;
}

StepSkew StepSkewSum::result() const {
  StepSkew s;
  if (added_ < 2) return s;
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i] != added_) continue;  // a row some rank did not write
    s.slowest_s += slowest_[i];
    s.mean_s += sum_[i] / added_;
    ++s.steps;
  }
  return s;
}

double GraphSteps::mean_s(std::int8_t kind) const {
  const auto k = static_cast<std::size_t>(kind);
  return steps[k] > 0 ? seconds[k] / static_cast<double>(steps[k]) : kNaN;
}

GraphSteps graph_steps(const std::vector<StepTime>& rows) {
  GraphSteps out;
  for (const StepTime& row : rows) {
    if (row.epoch < 0) continue;
    if (row.cuda_graph < 0 || row.cuda_graph >= kGraphKinds) {
      ++out.not_recorded;
      continue;
    }
    ++out.steps[static_cast<std::size_t>(row.cuda_graph)];
    out.seconds[static_cast<std::size_t>(row.cuda_graph)] += row.step_s;
  }
  return out;
}

}  // namespace mgbench::results
