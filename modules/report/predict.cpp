// The scaling predictor's model (predict.h, docs/design.md "The scaling predictor"): a base run's
// measured step, priced at each rank count and strategy with the collectives that step issues. What
// it reads from runs: predict_measure.cpp; the `mgbench predict` command around it: predict_plan.cpp.
#include "report/predict.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "axes/bus_bandwidth.h"

namespace mgbench::report {

std::vector<double> gradient_buckets(double gradient_bytes, double first_bucket_bytes, double bucket_bytes) {
  std::vector<double> buckets;
  double left = gradient_bytes;
  double cap = first_bucket_bytes;
  while (left > 0) {
    buckets.push_back(std::min(left, cap));
    left -= buckets.back();
    cap = bucket_bytes;
  }
  return buckets;
}

double link_bytes_per_step(const MeasuredStep& m, const axes::ParallelPlan& plan, const std::vector<double>& buckets,
                           std::int64_t micro_batches) {
  const int n = plan.world;
  if (n <= 1) return 0;
  auto sum = [](const std::vector<double>& sizes) { return std::accumulate(sizes.begin(), sizes.end(), 0.0); };
  const double micro = static_cast<double>(micro_batches);
  double bytes = micro * sum(m.buffer_broadcast_bytes) * axes::broadcast_bus_factor(n) +
                 m.loss_allreduce_bytes * axes::all_reduce_bus_factor(n);
  if (plan.fully_sharded()) {
    bytes += micro * (sum(m.allgather_bytes) + sum(m.reducescatter_bytes)) * axes::gather_scatter_bus_factor(n);
  } else if (plan.replicated()) {
    bytes += sum(buckets) * axes::all_reduce_bus_factor(n);
  }
  return bytes;
}

namespace {

/// n ranks on `nodes` nodes, as the notes say it.
std::string placement(int n, int nodes) {
  return nodes > 1 ? fmt::format("{} ranks on {} nodes", n, nodes) : fmt::format("{} ranks", n);
}

/// The cost of `collective` at n ranks on `nodes` nodes: the comm run's measurement there, else the
/// assumed link, else none.
std::optional<CollectiveCost> cost_at(const std::vector<CollectiveCost>& measured, const char* collective, int n,
                                      int nodes, const LinkAssumption* link) {
  for (const auto& c : measured) {
    if (c.world_size() == n && c.nodes() == nodes) return c;
  }
  if (link == nullptr) return std::nullopt;
  return CollectiveCost(collective, n, *link, nodes);
}

/// How to measure what is missing: the comm command for n ranks on `nodes` nodes.
std::string comm_command(int n, int nodes, const char* collective) {
  return fmt::format("mpirun -np {}{} mgbench comm --collective {}", n,
                     nodes > 1 ? fmt::format(" --map-by ppr:{}:node", (n + nodes - 1) / nodes) : "", collective);
}

/// The collectives a step of m issues at n > 1 ranks, each priced: FSDP's all-gathers and
/// reduce-scatters or DDP's all-reduce, the buffers' broadcasts, a summed loss's normaliser
/// all-reduce. `missing`: the first the base needs that neither a comm run nor the link prices (the
/// buffers' broadcasts and FSDP's loss normaliser excepted: left unpriced, with a note -- `mgbench
/// comm` measures the all-reduce only by default, an FSDP user the gathers and scatters).
struct StepCollectives {
  std::optional<CollectiveCost> all_reduce, all_gather, reduce_scatter, broadcast;
  const char* missing = nullptr;
};
StepCollectives step_collectives(const MeasuredStep& m, const CommCosts& costs, int n, int nodes,
                                 const LinkAssumption* link, std::vector<std::string>& notes) {
  StepCollectives c;
  const bool fsdp = m.plan.at(n).fully_sharded();
  const auto need = [&](std::optional<CollectiveCost>& cost, const std::vector<CollectiveCost>& measured,
                        const char* name) {
    cost = cost_at(measured, name, n, nodes, link);
    if (!cost && c.missing == nullptr) c.missing = name;
  };
  if (fsdp) {
    need(c.all_gather, costs.all_gather, "all-gather");
    need(c.reduce_scatter, costs.reduce_scatter, "reduce-scatter");
  }
  if (!fsdp) need(c.all_reduce, costs.all_reduce, "all-reduce");
  if (fsdp && m.loss_allreduce_bytes > 0) c.all_reduce = cost_at(costs.all_reduce, "all-reduce", n, nodes, link);
  if (!m.buffer_broadcast_bytes.empty()) c.broadcast = cost_at(costs.broadcast, "broadcast", n, nodes, link);
  // The step's small extras: left out where unmeasured, saying so.
  const auto unpriced = [&](const char* what, const char* collective) {
    notes.push_back(fmt::format("{}: {} not priced: no {} measured at {} ({}) and no --link assumption",
                                placement(n, nodes), what, collective, placement(n, nodes),
                                comm_command(n, nodes, collective)));
  };
  if (c.missing != nullptr) return c;
  if (!m.buffer_broadcast_bytes.empty() && !c.broadcast) unpriced("the buffers' broadcasts", "broadcast");
  if (m.loss_allreduce_bytes > 0 && !c.all_reduce) unpriced("the loss normaliser's all-reduce", "all-reduce");
  return c;
}

/// The largest per-step term of a prediction.
std::string limiting_phase(const Prediction& p, const MeasuredStep& m, double loads, double optimizer_s) {
  const std::vector<std::pair<const char*, double>> phases = {{"data", p.data_s},
                                                              {"h2d", m.h2d_s * loads},
                                                              {"transform", m.transform_s},
                                                              {"forward", m.forward_s},
                                                              {"backward", m.backward_s},
                                                              {"allreduce", p.allreduce_s},
                                                              {"allgather", p.allgather_s},
                                                              {"reducescatter", p.reducescatter_s},
                                                              {"buffer_broadcast", p.buffer_broadcast_s},
                                                              {"loss_reduce", p.loss_reduce_s},
                                                              {"optimizer", optimizer_s}};
  return std::max_element(phases.begin(), phases.end(),
                          [](const auto& a, const auto& b) { return a.second < b.second; })
      ->first;
}

/// The base run's configuration that sets its steps at any rank count and its gradient buckets.
struct BaseShape {
  std::int64_t samples = 0, batch = 1, grad_accum = 1, max_steps = 0, epochs = 1;
  bool drop_last = false;
  std::vector<double> buckets;  // the all-reduce's gradient buckets [bytes]

  /// Steps per epoch per rank as the training loop runs them (the strategy row's count).
  std::int64_t steps_at(const axes::StrategyInfo& strategy, std::int64_t n) const {
    return axes::steps_per_epoch(strategy, {samples, batch, static_cast<int>(n), drop_last}, grad_accum, max_steps);
  }
};

BaseShape base_shape(const results::RunRecord& base, const MeasuredStep& m) {
  BaseShape s;
  s.samples = base.integer("train_samples").value_or(0);
  s.batch = base.integer("batch_size").value_or(1);
  s.grad_accum = base.integer("grad_accum").value_or(1);
  s.max_steps = base.integer("max_steps").value_or(0);
  s.drop_last = base.display("drop_last") == "true";
  s.epochs = base.integer("epochs").value_or(1);
  s.buckets = gradient_buckets(m.gradient_bytes, base.real("first_bucket_mb").value_or(1.0) * 1024 * 1024,
                               base.real("bucket_mb").value_or(25.0) * 1024 * 1024);
  return s;
}

/// The collectives a step at n ranks on `nodes` nodes issues, each priced (none at 1 rank); none,
/// with a note, where one the base needs has no price: that placement is skipped.
std::optional<StepCollectives> priced_collectives(const MeasuredStep& m, const CommCosts& costs, int n, int nodes,
                                                  const LinkAssumption* link, std::vector<std::string>& notes) {
  StepCollectives c;
  if (n > 1) {
    c = step_collectives(m, costs, n, nodes, link, notes);
    if (c.missing != nullptr) {
      notes.push_back(fmt::format("{} skipped: no {} measured at {} ({}) and no --link assumption", placement(n, nodes),
                                  c.missing, placement(n, nodes), comm_command(n, nodes, c.missing)));
      return std::nullopt;
    }
    const bool fsdp = m.plan.at(n).fully_sharded();
    if (nodes > 1 && link != nullptr && (fsdp ? c.all_gather : c.all_reduce)->source().rfind("assumed", 0) == 0) {
      notes.push_back(fmt::format("{}: the assumed link {} priced the collectives across nodes too",
                                  placement(n, nodes), link->name));
    }
  }
  return c;
}

/// The seconds of a list of collectives of `sizes` bytes at `cost`, one after another, the hidden
/// share taken off; 0 unpriced.
double exposed_s(const std::optional<CollectiveCost>& cost, const std::vector<double>& sizes, double hidden) {
  double seconds = 0;
  if (cost) {
    for (const double bytes : sizes) seconds += cost->seconds(bytes);
  }
  return seconds * (1.0 - hidden);
}

/// Fills in p (its base, strategy, ranks, nodes, scaling and FSDP overlap set) from the measured step
/// and the collectives priced at its rank count: the sources, steps, per-step terms, epoch and total
/// times and the limiting phase.
void price(Prediction& p, const MeasuredStep& m, const BaseShape& shape, const StepCollectives& c) {
  const int n = p.ranks;
  const axes::ParallelPlan plan = m.plan.at(n);
  const axes::StrategyInfo& strategy = *p.strategy;
  const auto& [all_reduce, all_gather, reduce_scatter, broadcast, missing] = c;
  p.comm_source = n == 1                 ? "none (1 rank)"
                  : plan.fully_sharded() ? fmt::format("all-gather: {}; reduce-scatter: {}", all_gather->source(),
                                                       reduce_scatter->source())
                                         : all_reduce->source();
  if (broadcast && broadcast->source() != p.comm_source) p.comm_source += "; broadcast: " + broadcast->source();
  p.steps = shape.steps_at(strategy, n);
  // ddp-rr: every rank loads and copies every batch (the loop charges them to its next step).
  const double loads = strategy.loads_every_batch ? n : 1;
  // FSDP's optimizer updates this rank's shards: 1/n of the parameters.
  const double optimizer_s = m.optimizer_s / plan.shard_world();
  // What ranks beside one another cost each (measured; 1 at 1 rank) slows the device's work, not the copies.
  p.compute_s =
      m.h2d_s * loads + (m.transform_s + m.forward_s + m.backward_s + optimizer_s + m.other_s) * p.scaling.contention;
  p.data_s = m.data_s * loads;
  // FSDP's per micro-batch, grad_accum of them a step.
  const double micro_batches = static_cast<double>(shape.grad_accum);
  p.allgather_s = micro_batches * exposed_s(all_gather, m.allgather_bytes, p.fsdp_overlap);
  p.reducescatter_s = micro_batches * exposed_s(reduce_scatter, m.reducescatter_bytes, p.fsdp_overlap);
  p.allreduce_s = plan.fully_sharded() ? 0.0 : exposed_s(all_reduce, shape.buckets, p.scaling.overlap);
  // Neither overlaps compute: the forward waits for the buffers, the optimizer for the normaliser.
  p.buffer_broadcast_s = micro_batches * exposed_s(broadcast, m.buffer_broadcast_bytes, 0.0);
  p.loss_reduce_s = m.loss_allreduce_bytes > 0 ? exposed_s(all_reduce, {m.loss_allreduce_bytes}, 0.0) : 0.0;
  p.link_bytes = link_bytes_per_step(m, plan, shape.buckets, shape.grad_accum);
  p.epoch_s = static_cast<double>(p.steps) *
              (p.compute_s + p.data_s + p.allreduce_s + p.allgather_s + p.reducescatter_s + p.buffer_broadcast_s +
               p.loss_reduce_s) *
              p.scaling.spread;
  p.eval_s = m.eval_s / n;
  p.evaluated_epochs = m.evaluated_epochs;
  p.warmup_s = m.warmup_s;
  p.total_s = static_cast<double>(shape.epochs) * p.epoch_s + m.warmup_s +
              static_cast<double>(m.evaluated_epochs) * p.eval_s + m.startup_s;
  p.limiting = limiting_phase(p, m, loads, optimizer_s);
}

/// T(1 rank) of the same model (the base's own configuration at 1 rank), where the rank counts
/// asked leave out 1.
double one_rank_total_s(const MeasuredStep& m, const BaseShape& shape, const axes::StrategyInfo& strategy) {
  const std::int64_t steps1 = shape.steps_at(strategy, 1);
  return static_cast<double>(shape.epochs * steps1) * (m.compute_s() + m.data_s) + m.warmup_s +
         static_cast<double>(m.evaluated_epochs) * m.eval_s + m.startup_s;
}

}  // namespace

std::vector<Prediction> predict(const results::RunRecord& base,
                                const std::vector<const results::RunRecord*>& multi_rank, const CommCosts& costs,
                                const LinkAssumption* link, const std::vector<std::int64_t>& ranks,
                                std::int64_t ranks_per_node, const std::vector<axes::Strategy>& strategies,
                                std::vector<std::string>& notes, const ModelScaling* model) {
  // The multi-rank runs measured the base's model: its step, not the rescaled one, tells FSDP's hidden share.
  const MeasuredStep measured = measure_step(base);
  const MeasuredStep m = model != nullptr ? rescaled(measured, *model) : measured;
  const BaseShape shape = base_shape(base, m);
  std::vector<Prediction> out;
  for (const axes::Strategy value : strategies) {
    const axes::StrategyInfo& strategy = axes::strategy_info(value);
    double one_rank_total = NAN;
    for (const std::int64_t ranks_n : ranks) {
      const int n = static_cast<int>(ranks_n);
      const int nodes = ranks_per_node > 0 ? static_cast<int>((ranks_n + ranks_per_node - 1) / ranks_per_node) : 1;
      // Learnt from the other placements' runs only, of the strategy where there are.
      std::vector<const results::RunRecord*> others, same_strategy;
      for (const auto* r : multi_rank) {
        if (r->integer("world_size").value_or(1) == n && r->integer("nodes").value_or(1) == nodes) continue;
        others.push_back(r);
        if (r->display("strategy") == strategy.name) same_strategy.push_back(r);
      }
      const auto& learnt_from = same_strategy.empty() ? others : same_strategy;
      Prediction p;
      p.base = &base;
      p.strategy = &strategy;
      p.ranks = n;
      p.nodes = nodes;
      p.scaling = n > 1 ? measure_scaling(measured, learnt_from) : MeasuredScaling{};
      p.fsdp_overlap =
          n > 1 && m.plan.sharding == axes::Sharding::kFsdp ? measure_fsdp_overlap(measured, learnt_from) : 0;
      if (model != nullptr) p.model = *model;
      const std::optional<StepCollectives> c = priced_collectives(m, costs, n, nodes, link, notes);
      if (!c) continue;
      price(p, m, shape, *c);
      if (n == 1) one_rank_total = p.total_s;
      out.push_back(std::move(p));
    }
    if (!std::isfinite(one_rank_total)) one_rank_total = one_rank_total_s(m, shape, strategy);
    for (auto& p : out) {
      if (p.strategy == &strategy) p.speedup = one_rank_total / p.total_s;
    }
  }
  return out;
}

bool is_prediction_run(const results::RunRecord& run) { return run.display("task") == "prediction"; }

}  // namespace mgbench::report
