// What `mgbench predict` reads from measured runs: a 1-rank run's time per optimizer step by phase
// and the bytes its collectives move (MeasuredStep), and from multi-rank runs of the workload the
// share of the all-reduce hidden behind backward, the straggler spread and FSDP's hidden share.
#include <algorithm>
#include <cmath>
#include <exception>
#include <string>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "report/predict.h"
#include "report/report.h"

namespace mgbench::report {

const axes::PrecisionInfo& precision_of(const results::RunRecord& r) {
  const std::string name = r.display("precision");
  try {
    return axes::find_precision("precision", name);
  } catch (const ConfigError&) {
    throw ResultsError(fmt::format("run {} ({}): precision '{}' is not one this mgbench knows ({})", r.run_id, r.file,
                                   name, options::join_names(options::names_of(axes::precision_choices()))));
  }
}

axes::ParallelPlan parallel_plan_of(const results::RunRecord& r) {
  axes::ParallelPlan plan;
  plan.world = static_cast<int>(r.integer("world_size").value_or(1));
  const std::string sharding = r.display("sharding");
  if (!sharding.empty()) {
    const auto rows = axes::sharding_choices();
    const auto row = std::find_if(rows.begin(), rows.end(), [&](const auto& c) { return c.name == sharding; });
    MGBENCH_REQUIRE(row != rows.end(), ResultsError, "run {} ({}): sharding '{}' is not one this mgbench knows ({})",
                    r.run_id, r.file, sharding, options::join_names(options::names_of(rows)));
    plan.sharding = row->value;
  }
  plan.reshard_after_forward = r.display("reshard_after_forward") != "false";
  return plan;
}

namespace {

/// A comma-separated list of byte counts (the fsdp_*_bytes attributes); "" is none. Throws
/// ResultsError naming the run and the attribute when it is missing or not such a list.
std::vector<double> byte_list(const results::RunRecord& r, const std::string& name) {
  const auto it =
      std::find_if(r.attributes.begin(), r.attributes.end(), [&](const auto& a) { return a.first == name; });
  const std::string* text = it == r.attributes.end() ? nullptr : std::get_if<std::string>(&it->second);
  MGBENCH_REQUIRE(text != nullptr, ResultsError,
                  "run {} ({}) has --sharding fsdp but no {} (written by an mgbench before FSDP steps were predicted)",
                  r.run_id, r.file, name);
  std::vector<double> out;
  std::size_t start = 0;
  while (start < text->size()) {
    const std::size_t end = std::min(text->find(',', start), text->size());
    const std::string item = text->substr(start, end - start);
    std::size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MGBENCH_REQUIRE(used == item.size() && !item.empty() && value >= 0, ResultsError,
                    "run {} ({}): {} '{}': expected comma-separated byte counts", r.run_id, r.file, name, *text);
    out.push_back(static_cast<double>(value));
    start = end + 1;
  }
  return out;
}

/// byte_list, or none where the run does not record `name` (an mgbench before schema 6).
std::vector<double> recorded_byte_list(const results::RunRecord& r, const std::string& name) {
  const bool recorded =
      std::any_of(r.attributes.begin(), r.attributes.end(), [&](const auto& a) { return a.first == name; });
  return recorded ? byte_list(r, name) : std::vector<double>{};
}

/// The warm-up a run pays once: its first step's time beyond the median of the next ones (0 with
/// fewer than 3 steps recorded).
double warmup_s(const std::vector<double>& first_step_s) {
  if (first_step_s.size() < 3) return 0;
  std::vector<double> next(first_step_s.begin() + 1, first_step_s.end());
  const auto middle = next.begin() + static_cast<std::ptrdiff_t>(next.size() / 2);
  std::nth_element(next.begin(), middle, next.end());
  return std::max(0.0, first_step_s.front() - *middle);
}

}  // namespace

MeasuredStep measure_step(const results::RunRecord& r) {
  MGBENCH_REQUIRE(!r.epochs.empty() && !r.epochs.front().empty(), ResultsError,
                  "run {} ({}) has no completed epoch to measure", r.run_id, r.file);
  MGBENCH_REQUIRE(r.integer("trainable_parameters").has_value(), ResultsError,
                  "run {} ({}) does not record trainable_parameters (written by an mgbench before schema 3)", r.run_id,
                  r.file);
  MeasuredStep m;
  double train_s = 0, eval_s = 0;
  std::int64_t steps = 0;
  for (const auto& e : r.epochs.front()) {  // rank 0
    m.data_s += e.phases.data_s;
    m.h2d_s += e.phases.h2d_s;
    m.transform_s += e.phases.transform_s;
    m.forward_s += e.phases.forward_s;
    m.backward_s += e.phases.backward_s;
    m.optimizer_s += e.phases.optimizer_s;
    train_s += e.train_s;
    steps += e.steps;
    if (std::isfinite(e.eval_s)) {
      eval_s += e.eval_s;
      ++m.evaluated_epochs;
    }
  }
  MGBENCH_REQUIRE(steps > 0, ResultsError, "run {} ({}) took no optimizer step", r.run_id, r.file);
  const double n = static_cast<double>(steps);
  const double phases = m.data_s + m.h2d_s + m.transform_s + m.forward_s + m.backward_s + m.optimizer_s;
  m.other_s = std::max(0.0, train_s - phases);
  // The warm-up comes out of the compute phases in proportion (the per-step times are then a steady
  // step's) and is added once to the total.
  const double compute = phases - m.data_s + m.other_s;
  m.warmup_s = std::min(warmup_s(r.first_step_s), compute);
  const double steady = compute > 0 ? 1.0 - m.warmup_s / compute : 1.0;
  for (double* v : {&m.h2d_s, &m.transform_s, &m.forward_s, &m.backward_s, &m.optimizer_s, &m.other_s}) *v *= steady;
  for (double* v : {&m.data_s, &m.h2d_s, &m.transform_s, &m.forward_s, &m.backward_s, &m.optimizer_s, &m.other_s}) {
    *v /= n;
  }
  m.eval_s = m.evaluated_epochs > 0 ? eval_s / static_cast<double>(m.evaluated_epochs) : 0;
  const double summary_eval = std::isfinite(r.summary.eval_s) ? r.summary.eval_s : 0;
  m.startup_s = std::max(0.0, r.summary.total_s - r.summary.train_s - summary_eval);
  m.gradient_bytes = static_cast<double>(*r.integer("trainable_parameters")) *
                     axes::dtype_info(precision_of(r).gradient_dtype()).bytes;
  m.buffer_broadcast_bytes = recorded_byte_list(r, "buffer_broadcast_bytes");
  m.loss_allreduce_bytes = static_cast<double>(r.integer("loss_allreduce_bytes").value_or(0));
  m.plan = parallel_plan_of(r);
  m.cuda_graphs = r.text("cuda_graphs_decision").value_or("") == "on";
  if (m.plan.sharding == axes::Sharding::kFsdp) {
    m.allgather_bytes = byte_list(r, "fsdp_allgather_bytes");
    m.reducescatter_bytes = byte_list(r, "fsdp_reducescatter_bytes");
    MGBENCH_REQUIRE(!m.allgather_bytes.empty(), ResultsError, "run {} ({}): fsdp_allgather_bytes is empty", r.run_id,
                    r.file);
  }
  return m;
}

MeasuredStep rescaled(MeasuredStep m, const ModelScaling& model) {
  for (double* v : {&m.forward_s, &m.backward_s, &m.eval_s}) *v *= model.compute_factor;
  m.optimizer_s *= model.optimizer_factor;
  m.gradient_bytes *= model.optimizer_factor;
  if (m.plan.sharding == axes::Sharding::kFsdp) {
    m.allgather_bytes = model.allgather_bytes;
    m.reducescatter_bytes = model.reducescatter_bytes;
  }
  return m;
}

MeasuredScaling measure_scaling(const MeasuredStep& base, const std::vector<const results::RunRecord*>& multi_rank) {
  MeasuredScaling s;
  double window = 0, exposed = 0, slowest = 0, mean = 0, compute = 0, base_compute = 0;
  // Each rank pays the warm-up once, in its first epoch; its share outside the data and the copies.
  const double warmup = base.compute_s() > 0 ? base.warmup_s * base.device_compute_s() / base.compute_s() : 0.0;
  for (const auto* r : multi_rank) {
    s.sources.push_back(r->run_id);
    const bool graphs = r->text("cuda_graphs_decision").value_or("") == "on";
    // A run under CUDA graphs all-reduces after backward by construction (train/step_graphs.h):
    // nothing to learn of the overlap from it; its ranks' spread counts.
    if (!graphs) {
      const AllReduceTimes t = all_reduce_times(*r);
      window += t.window_s;
      exposed += t.exposed_s;
    }
    // Synchronous ranks end each step together, the faster ones waiting in its collectives.
    slowest += r->step_skew.slowest_s;
    mean += r->step_skew.mean_s;
    if (graphs != base.cuda_graphs || parallel_plan_of(*r).sharding == axes::Sharding::kFsdp) continue;
    for (const auto& rank : r->epochs) {
      for (std::size_t k = 0; k < rank.size(); ++k) {
        const auto& e = rank[k];
        if (e.steps <= 0) continue;
        compute += e.train_s - results::collective_s(e.phases) - e.phases.data_s - e.phases.h2d_s;
        base_compute += static_cast<double>(e.steps) * base.device_compute_s() + (k == 0 ? warmup : 0.0);
      }
    }
  }
  if (window > 0) s.overlap = std::clamp(1.0 - exposed / window, 0.0, 1.0);
  if (mean > 0) s.spread = slowest / mean;
  if (base_compute > 0 && compute > 0) s.contention = compute / base_compute;
  return s;
}

double measure_fsdp_overlap(const MeasuredStep& base, const std::vector<const results::RunRecord*>& multi_rank) {
  // Each rank pays the warm-up once, in its first epoch: its forward and backward share (the warm-up
  // came out of the compute phases in proportion) is no collective's.
  const double compute = base.compute_s();
  const double warmup_fb = compute > 0 ? base.warmup_s * (base.forward_s + base.backward_s) / compute : 0.0;
  double window = 0, exposed = 0;
  for (const auto* r : multi_rank) {
    if (parallel_plan_of(*r).sharding != axes::Sharding::kFsdp) continue;
    for (const auto& rank : r->epochs) {
      for (std::size_t k = 0; k < rank.size(); ++k) {
        const auto& e = rank[k];
        if (e.steps <= 0) continue;
        const double steps = static_cast<double>(e.steps);
        window += e.allgather_s + e.reducescatter_s;
        exposed += std::max(0.0, e.phases.forward_s + e.phases.backward_s - steps * (base.forward_s + base.backward_s) -
                                     (k == 0 ? warmup_fb : 0.0));
      }
    }
  }
  return window > 0 ? std::clamp(1.0 - exposed / window, 0.0, 1.0) : 0.0;
}

}  // namespace mgbench::report
