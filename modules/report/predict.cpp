#include "report/predict.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/timer.h"
#include "report/report.h"
#include "report/table.h"
#include "results/writer.h"

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

const axes::PrecisionInfo& precision_of(const results::RunRecord& r) {
  const std::string name = r.display("precision");
  try {
    return axes::find_precision("precision", name);
  } catch (const ConfigError&) {
    throw ResultsError(fmt::format("run {} ({}): precision '{}' is not one this mgbench knows ({})", r.run_id, r.file,
                                   name, options::join_names(options::names_of(axes::precision_choices()))));
  }
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
  m.other_s = std::max(0.0, train_s - phases) / n;
  for (double* v : {&m.data_s, &m.h2d_s, &m.transform_s, &m.forward_s, &m.backward_s, &m.optimizer_s}) *v /= n;
  m.eval_s = m.evaluated_epochs > 0 ? eval_s / static_cast<double>(m.evaluated_epochs) : 0;
  const double summary_eval = std::isfinite(r.summary.eval_s) ? r.summary.eval_s : 0;
  m.startup_s = std::max(0.0, r.summary.total_s - r.summary.train_s - summary_eval);
  m.gradient_bytes = static_cast<double>(*r.integer("trainable_parameters")) *
                     axes::dtype_info(precision_of(r).gradient_dtype()).bytes;
  m.buffer_broadcast_bytes = recorded_byte_list(r, "buffer_broadcast_bytes");
  m.loss_allreduce_bytes = static_cast<double>(r.integer("loss_allreduce_bytes").value_or(0));
  m.fsdp = r.display("sharding") == "fsdp";
  if (m.fsdp) {
    m.allgather_bytes = byte_list(r, "fsdp_allgather_bytes");
    m.reducescatter_bytes = byte_list(r, "fsdp_reducescatter_bytes");
    MGBENCH_REQUIRE(!m.allgather_bytes.empty(), ResultsError, "run {} ({}): fsdp_allgather_bytes is empty", r.run_id,
                    r.file);
  }
  return m;
}

MeasuredScaling measure_scaling(const std::vector<const results::RunRecord*>& multi_rank) {
  MeasuredScaling s;
  double window = 0, exposed = 0, spread = 0;
  std::int64_t spreads = 0;
  for (const auto* r : multi_rank) {
    s.sources.push_back(r->run_id);
    const AllReduceTimes t = all_reduce_times(*r);
    window += t.window_s;
    exposed += t.exposed_s;
    // Synchronous ranks end their epochs together; where they differ is the time outside the
    // collectives (the faster rank waits in them): compare that.
    const std::size_t epochs = r->epochs.empty() ? 0 : r->epochs.front().size();
    for (std::size_t k = 0; k < epochs; ++k) {
      double sum = 0, slowest = 0;
      std::size_t n = 0;
      for (const auto& rank : r->epochs) {
        if (k >= rank.size()) continue;
        const double own = rank[k].train_s - results::collective_s(rank[k].phases);
        sum += own;
        slowest = std::max(slowest, own);
        ++n;
      }
      if (n > 1 && sum > 0) {
        spread += slowest / (sum / static_cast<double>(n));
        ++spreads;
      }
    }
  }
  if (window > 0) s.overlap = std::clamp(1.0 - exposed / window, 0.0, 1.0);
  if (spreads > 0) s.spread = spread / static_cast<double>(spreads);
  return s;
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
  const auto need = [&](std::optional<CollectiveCost>& cost, const std::vector<CollectiveCost>& measured,
                        const char* name) {
    cost = cost_at(measured, name, n, nodes, link);
    if (!cost && c.missing == nullptr) c.missing = name;
  };
  if (m.fsdp) {
    need(c.all_gather, costs.all_gather, "all-gather");
    need(c.reduce_scatter, costs.reduce_scatter, "reduce-scatter");
  }
  if (!m.fsdp) need(c.all_reduce, costs.all_reduce, "all-reduce");
  if (m.fsdp && m.loss_allreduce_bytes > 0) c.all_reduce = cost_at(costs.all_reduce, "all-reduce", n, nodes, link);
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

}  // namespace

double measure_fsdp_overlap(const MeasuredStep& base, const std::vector<const results::RunRecord*>& multi_rank) {
  double window = 0, exposed = 0;
  for (const auto* r : multi_rank) {
    if (r->display("sharding") != "fsdp") continue;
    for (const auto& rank : r->epochs) {
      for (const auto& e : rank) {
        if (e.steps <= 0) continue;
        const double steps = static_cast<double>(e.steps);
        window += e.allgather_s + e.reducescatter_s;
        exposed += std::max(0.0, e.phases.forward_s + e.phases.backward_s - steps * (base.forward_s + base.backward_s));
      }
    }
  }
  return window > 0 ? std::clamp(1.0 - exposed / window, 0.0, 1.0) : 0.0;
}

std::vector<Prediction> predict(const results::RunRecord& base,
                                const std::vector<const results::RunRecord*>& multi_rank, const CommCosts& costs,
                                const LinkAssumption* link, const std::vector<std::int64_t>& ranks,
                                std::int64_t ranks_per_node, const std::vector<axes::Strategy>& strategies,
                                std::vector<std::string>& notes) {
  const MeasuredStep m = measure_step(base);
  const std::int64_t samples = base.integer("train_samples").value_or(0);
  const std::int64_t batch = base.integer("batch_size").value_or(1);
  const std::int64_t grad_accum = base.integer("grad_accum").value_or(1);
  const std::int64_t max_steps = base.integer("max_steps").value_or(0);
  const bool drop_last = base.display("drop_last") == "true";
  const std::int64_t epochs = base.integer("epochs").value_or(1);
  const std::vector<double> buckets =
      gradient_buckets(m.gradient_bytes, base.real("first_bucket_mb").value_or(1.0) * 1024 * 1024,
                       base.real("bucket_mb").value_or(25.0) * 1024 * 1024);
  std::vector<Prediction> out;
  // Steps per epoch per rank as the training loop runs them (the strategy row's count).
  auto steps_at = [&](const axes::StrategyInfo& strategy, std::int64_t n) {
    return axes::steps_per_epoch(strategy, {samples, batch, static_cast<int>(n), drop_last}, grad_accum, max_steps);
  };
  for (const axes::Strategy value : strategies) {
    const axes::StrategyInfo& strategy = axes::strategy_info(value);
    std::vector<const results::RunRecord*> same_strategy;
    for (const auto* r : multi_rank) {
      if (r->display("strategy") == strategy.name) same_strategy.push_back(r);
    }
    const MeasuredScaling scaling = measure_scaling(same_strategy.empty() ? multi_rank : same_strategy);
    const double fsdp_overlap =
        m.fsdp ? measure_fsdp_overlap(m, same_strategy.empty() ? multi_rank : same_strategy) : 0;
    double one_rank_total = NAN;
    for (const std::int64_t ranks_n : ranks) {
      const int n = static_cast<int>(ranks_n);
      const int nodes = ranks_per_node > 0 ? static_cast<int>((ranks_n + ranks_per_node - 1) / ranks_per_node) : 1;
      Prediction p;
      p.base = &base;
      p.strategy = &strategy;
      p.ranks = n;
      p.nodes = nodes;
      p.scaling = n > 1 ? scaling : MeasuredScaling{};
      p.fsdp_overlap = n > 1 ? fsdp_overlap : 0;
      // The collectives this step issues, each priced at n ranks.
      StepCollectives c;
      if (n > 1) {
        c = step_collectives(m, costs, n, nodes, link, notes);
        if (c.missing != nullptr) {
          notes.push_back(fmt::format("{} skipped: no {} measured at {} ({}) and no --link assumption",
                                      placement(n, nodes), c.missing, placement(n, nodes),
                                      comm_command(n, nodes, c.missing)));
          continue;
        }
        if (nodes > 1 && link != nullptr && (m.fsdp ? c.all_gather : c.all_reduce)->source().rfind("assumed", 0) == 0) {
          notes.push_back(fmt::format("{}: the assumed link {} priced the collectives across nodes too",
                                      placement(n, nodes), link->name));
        }
      }
      const auto& [all_reduce, all_gather, reduce_scatter, broadcast, missing] = c;
      p.comm_source =
          n == 1   ? "none (1 rank)"
          : m.fsdp ? fmt::format("all-gather: {}; reduce-scatter: {}", all_gather->source(), reduce_scatter->source())
                   : all_reduce->source();
      if (broadcast && broadcast->source() != p.comm_source) p.comm_source += "; broadcast: " + broadcast->source();
      p.steps = steps_at(strategy, n);
      // ddp-rr: every rank loads and copies every batch (the loop charges them to its next step).
      const double loads = strategy.loads_every_batch ? n : 1;
      // FSDP's optimizer updates this rank's shards: 1/n of the parameters.
      const double optimizer_s = m.fsdp ? m.optimizer_s / n : m.optimizer_s;
      p.compute_s = m.h2d_s * loads + m.transform_s + m.forward_s + m.backward_s + optimizer_s + m.other_s;
      p.data_s = m.data_s * loads;
      // Each collective of the list, one after another, the hidden share taken off.
      const auto exposed = [](const std::optional<CollectiveCost>& cost, const std::vector<double>& sizes,
                              double hidden) {
        double seconds = 0;
        if (cost) {
          for (const double bytes : sizes) seconds += cost->seconds(bytes);
        }
        return seconds * (1.0 - hidden);
      };
      // FSDP's per micro-batch, grad_accum of them a step.
      const double micro_batches = static_cast<double>(grad_accum);
      p.allgather_s = micro_batches * exposed(all_gather, m.allgather_bytes, p.fsdp_overlap);
      p.reducescatter_s = micro_batches * exposed(reduce_scatter, m.reducescatter_bytes, p.fsdp_overlap);
      p.allreduce_s = m.fsdp ? 0.0 : exposed(all_reduce, buckets, p.scaling.overlap);
      // Neither overlaps compute: the forward waits for the buffers, the optimizer for the normaliser.
      p.buffer_broadcast_s = micro_batches * exposed(broadcast, m.buffer_broadcast_bytes, 0.0);
      p.loss_reduce_s = m.loss_allreduce_bytes > 0 ? exposed(all_reduce, {m.loss_allreduce_bytes}, 0.0) : 0.0;
      p.epoch_s = static_cast<double>(p.steps) *
                  (p.compute_s + p.data_s + p.allreduce_s + p.allgather_s + p.reducescatter_s + p.buffer_broadcast_s +
                   p.loss_reduce_s) *
                  p.scaling.spread;
      p.eval_s = m.eval_s / n;
      p.evaluated_epochs = m.evaluated_epochs;
      p.total_s =
          static_cast<double>(epochs) * p.epoch_s + static_cast<double>(m.evaluated_epochs) * p.eval_s + m.startup_s;
      if (n == 1) one_rank_total = p.total_s;
      p.limiting = limiting_phase(p, m, loads, optimizer_s);
      out.push_back(std::move(p));
    }
    // T(1 rank) of the same model (the base's own configuration at 1 rank).
    if (!std::isfinite(one_rank_total)) {
      const std::int64_t steps1 = steps_at(strategy, 1);
      one_rank_total = static_cast<double>(epochs * steps1) * (m.h2d_s + m.transform_s + m.forward_s + m.backward_s +
                                                               m.optimizer_s + m.other_s + m.data_s) +
                       static_cast<double>(m.evaluated_epochs) * m.eval_s + m.startup_s;
    }
    for (auto& p : out) {
      if (p.strategy == &strategy) p.speedup = one_rank_total / p.total_s;
    }
  }
  return out;
}

std::string workload_of(const results::RunRecord& r) {
  std::string task = r.display("task");
  if (task == "prediction") task = r.display("predicted_task");
  return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", task, r.display("recipe"), r.display("device"),
                     r.display("precision"), r.display("pin_memory"), r.display("image_size"), r.display("width_mult"),
                     r.display("model"), r.display("dataset"), r.display("epochs"), r.display("batch_size"),
                     r.display("grad_accum"), r.display("train_samples"), r.display("max_steps"),
                     r.display("sharding"));
}

bool is_prediction_run(const results::RunRecord& run) { return run.display("task") == "prediction"; }

void PredictOptions::declare(options::OptionTable& t) {
  t.add("files", files, "results files with the measured runs (files, directories, quoted patterns)")
      .positional()
      .required()
      .value_name("FILE...");
  t.add("comm", comm_files, "results files with `mgbench comm` runs (comm runs among FILE... are used too)")
      .repeatable()
      .value_name("FILE");
  constexpr std::int64_t kMaxRanks = 1 << 20;
  t.add("ranks", ranks, "rank counts to predict, comma-separated")
      .check(
          [](const std::vector<std::int64_t>& v) {
            return !v.empty() &&
                   std::all_of(v.begin(), v.end(), [](std::int64_t n) { return n >= 1 && n <= kMaxRanks; });
          },
          fmt::format("comma-separated rank counts from 1 to {} (1,2,4)", kMaxRanks));
  // The strategies of several ranks: a single-process one (dp) has no other rank counts.
  static const std::vector<axes::StrategyInfo> multi_rank = [] {
    std::vector<axes::StrategyInfo> rows;
    for (const auto& row : axes::strategy_choices()) {
      if (!row.single_process) rows.push_back(row);
    }
    return rows;
  }();
  t.add("ranks-per-node", ranks_per_node,
        "ranks on each node: n ranks spread over ceil(n / this) nodes, their collectives priced from a comm run "
        "on as many nodes; 0: every rank count on one node")
      .at_least(0);
  t.add("strategies", strategies, std::span<const axes::StrategyInfo>(multi_rank), "strategies to predict");
  t.add("link", link,
        "where no comm run was measured at a rank count, assume this link (labelled as an assumption): " + link_names())
      .check([](const std::string& name) { return name.empty() || find_link(name) != nullptr; }, link_names());
  t.add("results", results, "results file the predictions are appended to")
      .check([](const std::string& path) { return !path.empty(); }, "a file path");
}

namespace {

/// A measured training run (not a comm run, a prediction or an evaluation).
bool usable(const results::RunRecord& r) {
  return is_completed(r) && !is_prediction_run(r) && !is_comm_run(r) && r.display("task") != "llm-eval";
}

/// The predictions of one workload at every strategy asked: each from the latest completed 1-rank
/// run of that strategy, else the latest of any.
std::vector<Prediction> predict_workload(const std::vector<results::RunRecord>& runs,
                                         const std::vector<const results::RunRecord*>& one_rank,
                                         const std::vector<const results::RunRecord*>& multi_rank,
                                         const PredictOptions& o, const LinkAssumption* link,
                                         std::vector<std::string>& notes) {
  std::vector<Prediction> out;
  for (const axes::Strategy strategy : o.strategies) {
    const results::RunRecord* base = one_rank.back();
    for (const auto* r : one_rank) {
      if (r->display("strategy") == axes::strategy_info(strategy).name) base = r;
    }
    // The collectives move the gradients (FSDP: and the parameters, of the same dtype): priced in
    // their dtype, by the precision's row.
    const std::string dtype(axes::dtype_info(precision_of(*base).gradient_dtype()).name);
    const std::string device = base->display("device");
    const auto costs_of = [&](const std::string& collective) {
      auto costs = collective_costs(runs, collective, dtype, device);
      if (costs.empty() && dtype != "fp32") {
        costs = collective_costs(runs, collective, "fp32", device);
        if (!costs.empty())
          notes.push_back(fmt::format("no {} {} measured: fp32 rows used by size", dtype, collective));
      }
      return costs;
    };
    const CommCosts costs{costs_of("all-reduce"), costs_of("all-gather"), costs_of("reduce-scatter"),
                          costs_of("broadcast")};
    if (costs.all_reduce.empty() && costs.all_gather.empty() && costs.reduce_scatter.empty() &&
        costs.broadcast.empty()) {
      notes.push_back(
          fmt::format("no completed comm run on {} among the files (mpirun -np N mgbench comm --device {}): only "
                      "--link can stand in",
                      device, device));
    }
    auto p = predict(*base, multi_rank, costs, link, o.ranks, o.ranks_per_node, {strategy}, notes);
    out.insert(out.end(), std::make_move_iterator(p.begin()), std::make_move_iterator(p.end()));
  }
  return out;
}

/// A prediction as a run: the base's attributes, then what was predicted and from what.
h5::Attributes prediction_attributes(const Prediction& p, const std::string& command_line) {
  h5::Attributes a = p.base->attributes;
  h5::merge_attributes(
      a, {{"task", std::string("prediction")},
          {"predicted_task", p.base->display("task")},
          {"strategy", std::string(p.strategy->name)},
          {"world_size", static_cast<std::int64_t>(p.ranks)},
          {"nodes", static_cast<std::int64_t>(p.nodes)},
          {"hosts", std::string()},
          {"slurm_job_id", std::string()},
          {"started_utc", utc_now_iso8601()},
          {"command_line", command_line},
          {"prediction_of", p.base->run_id},
          {"prediction_of_file", p.base->file},
          {"prediction_comm", p.comm_source},
          {"prediction_overlap", p.scaling.overlap},
          {"prediction_spread", p.scaling.spread},
          {"prediction_scaling_runs", fmt::format("{}", fmt::join(p.scaling.sources, ","))},
          {"prediction_steps_per_epoch", p.steps},
          {"prediction_compute_s_per_step", p.compute_s},
          {"prediction_data_s_per_step", p.data_s},
          {"prediction_allreduce_s_per_step", p.allreduce_s},
          {"prediction_allgather_s_per_step", p.allgather_s},
          {"prediction_reducescatter_s_per_step", p.reducescatter_s},
          {"prediction_fsdp_overlap", p.fsdp_overlap},
          {"prediction_buffer_broadcast_s_per_step", p.buffer_broadcast_s},
          {"prediction_loss_reduce_s_per_step", p.loss_reduce_s},
          {"prediction_limiting_phase", p.limiting},
          {"prediction_speedup", p.speedup},
          {"prediction_model", std::string("mgbench predict v2 (docs/design.md, The scaling predictor)")}});
  // What belonged to the measured run's own history.
  std::erase_if(a, [](const auto& attr) { return attr.first == "resumes" || attr.first == "resumed_utc"; });
  return a;
}

}  // namespace

PredictionPlan plan_predictions(const std::vector<results::RunRecord>& runs, const PredictOptions& o) {
  PredictionPlan plan;
  if (!o.link.empty()) plan.link = &link_assumption(o.link);
  // Per workload, in the files' order: its 1-rank runs (the bases) and its multi-rank runs.
  std::map<std::string, std::vector<const results::RunRecord*>> one_rank, multi_rank;
  std::vector<std::string> workloads;
  for (const auto& r : runs) {
    if (!usable(r)) continue;
    const std::string w = workload_of(r);
    if (r.integer("world_size").value_or(1) == 1) {
      if (one_rank.find(w) == one_rank.end()) workloads.push_back(w);
      one_rank[w].push_back(&r);
    } else {
      multi_rank[w].push_back(&r);
    }
  }
  MGBENCH_REQUIRE(!workloads.empty(), ResultsError,
                  "no completed 1-rank run of `mgbench image` or `mgbench llm` among the files: measure the workload "
                  "on 1 rank first");
  for (const auto& w : workloads) {
    try {
      plan.workloads.push_back(predict_workload(runs, one_rank[w], multi_rank[w], o, plan.link, plan.notes));
    } catch (const Error& e) {
      // One workload that cannot be predicted (a run of an older mgbench) leaves the others.
      plan.notes.push_back(fmt::format("workload of {} not predicted: {}", one_rank[w].back()->run_id, e.what()));
    }
  }
  std::sort(plan.notes.begin(), plan.notes.end());
  plan.notes.erase(std::unique(plan.notes.begin(), plan.notes.end()), plan.notes.end());
  return plan;
}

void write_predictions(const std::string& path, const PredictionPlan& plan, const std::string& command_line) {
  for (const auto& predictions : plan.workloads) {
    for (const auto& p : predictions) {
      // Named after what it predicts: <strategy>-<n>r-of-<the 1-rank run measured>.
      results::ResultsWriter writer(path, MPI_COMM_SELF,
                                    fmt::format("predicted-{}-{}r{}-of-{}", p.strategy->name, p.ranks,
                                                p.nodes > 1 ? fmt::format("{}n", p.nodes) : "", p.base->run_id),
                                    prediction_attributes(p, command_line), {{"rank", std::int64_t{0}}}, {});
      const std::int64_t epochs = p.base->integer("epochs").value_or(1);
      results::RunSummary s;
      s.total_s = p.total_s;
      s.train_s = p.epoch_s * static_cast<double>(epochs);
      s.eval_s = p.eval_s * static_cast<double>(p.evaluated_epochs);  // as a measured run's: the sum
      s.s_per_it = p.steps > 0 ? p.epoch_s / static_cast<double>(p.steps) : NAN;
      s.epochs_completed = epochs;
      s.finished_unix_s = static_cast<double>(std::time(nullptr));
      writer.write_summary(s);
      writer.finish(results::kStatusCompleted);
    }
  }
}

}  // namespace mgbench::report
