#include "report/predict.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "core/error.h"
#include "report/report.h"

namespace mgbench::report {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

/// Bytes of one gradient element: the parameters' dtype of the precision (train/precision.cpp).
double gradient_element_bytes(const std::string& precision) {
  if (precision == "fp64") return 8;
  if (precision == "fp16" || precision == "bf16") return 2;
  return 4;  // fp32, tf32, amp-* (fp32 master weights)
}

std::string number(double v, int digits) { return std::isfinite(v) ? fmt::format("{:.{}f}", v, digits) : "-"; }

}  // namespace

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

const LinkAssumption& link_assumption(const std::string& name) {
  std::string names;
  for (const auto& l : link_assumptions()) {
    if (l.name == name) return l;
    names += (names.empty() ? "" : ", ") + l.name;
  }
  throw ConfigError(fmt::format("--link '{}': expected one of {}", name, names));
}

AllReduceCost::AllReduceCost(int world_size, std::vector<std::pair<double, double>> points, std::string source)
    : world_size_(world_size), points_(std::move(points)), source_(std::move(source)) {
  MGBENCH_REQUIRE(!points_.empty(), ResultsError, "{}: no all-reduce rows", source_);
  std::sort(points_.begin(), points_.end());
}

AllReduceCost::AllReduceCost(int world_size, const LinkAssumption& link)
    : world_size_(world_size), link_(link), source_("assumed link " + link.name) {}

double AllReduceCost::seconds(double bytes) const {
  if (world_size_ <= 1) return 0;
  if (link_) {
    const double factor = 2.0 * (world_size_ - 1) / world_size_;
    return link_->latency_s + bytes * factor / (link_->busbw_gbs * 1e9);
  }
  if (bytes <= points_.front().first) return points_.front().second;
  const auto& [last_bytes, last_s] = points_.back();
  if (bytes >= last_bytes) return last_s + (bytes - last_bytes) * last_s / last_bytes;
  const auto hi = std::upper_bound(points_.begin(), points_.end(), std::make_pair(bytes, 0.0));
  const auto lo = hi - 1;
  const double f = (std::log(bytes) - std::log(lo->first)) / (std::log(hi->first) - std::log(lo->first));
  return std::exp(std::log(lo->second) + f * (std::log(hi->second) - std::log(lo->second)));
}

std::vector<AllReduceCost> all_reduce_costs(const std::vector<results::RunRecord>& runs, const std::string& dtype,
                                            const std::string& device) {
  std::map<int, AllReduceCost> by_ranks;
  for (const auto& r : runs) {
    // Only what measured the target: a completed comm run (its check passed) on the same device kind.
    if (r.display("task") != "comm" || r.comm.empty() || !is_completed(r) || r.display("device") != device) continue;
    std::map<double, std::pair<double, int>> sums;  // bytes -> (sum of rank means, ranks)
    for (const auto& rank : r.comm) {
      for (const auto& c : rank) {
        if (std::string_view(c.collective) != "all-reduce" || std::string_view(c.dtype) != dtype ||
            std::string_view(c.op) != "sum" || c.in_place != 0 || !std::isfinite(c.time_s)) {
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
    by_ranks.insert_or_assign(n,
                              AllReduceCost(n, std::move(points), fmt::format("comm run {} ({})", r.run_id, r.file)));
  }
  std::vector<AllReduceCost> out;
  for (auto& [n, cost] : by_ranks) out.push_back(std::move(cost));
  return out;
}

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

std::int64_t steps_per_epoch(const std::string& strategy, std::int64_t samples, std::int64_t batch_per_step, int ranks,
                             std::int64_t max_steps, bool drop_last) {
  std::int64_t steps = 0;
  if (strategy == "ddp-ds" || strategy == "dp") {
    const std::int64_t per_rank = drop_last ? samples / ranks : ceil_div(samples, ranks);  // DistributedSampler
    steps = drop_last ? per_rank / batch_per_step : ceil_div(per_rank, batch_per_step);
  } else {
    const std::int64_t batches = drop_last ? samples / batch_per_step : ceil_div(samples, batch_per_step);
    steps = strategy == "ddp-rr" ? ceil_div(batches, ranks) : batches;
  }
  return max_steps > 0 ? std::min(steps, max_steps) : steps;
}

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
  m.gradient_bytes =
      static_cast<double>(*r.integer("trainable_parameters")) * gradient_element_bytes(r.display("precision"));
  return m;
}

MeasuredScaling measure_scaling(const std::vector<const results::RunRecord*>& multi_rank) {
  MeasuredScaling s;
  double window = 0, exposed = 0, spread = 0;
  std::int64_t spreads = 0;
  for (const auto* r : multi_rank) {
    s.sources.push_back(r->run_id);
    for (const auto& rank : r->epochs) {
      for (const auto& e : rank) {
        if (std::isfinite(e.allreduce_window_s)) window += e.allreduce_window_s;
        exposed += e.phases.allreduce_s;
      }
    }
    // Synchronous ranks end their epochs together; where they differ is the time outside the
    // collectives (the faster rank waits in them): compare that.
    const std::size_t epochs = r->epochs.empty() ? 0 : r->epochs.front().size();
    for (std::size_t k = 0; k < epochs; ++k) {
      double sum = 0, slowest = 0;
      std::size_t n = 0;
      for (const auto& rank : r->epochs) {
        if (k >= rank.size()) continue;
        const double own = rank[k].train_s - rank[k].phases.allreduce_s;
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

std::vector<Prediction> predict(const results::RunRecord& base,
                                const std::vector<const results::RunRecord*>& multi_rank,
                                const std::vector<AllReduceCost>& costs, const LinkAssumption* link,
                                const std::vector<int>& ranks, const std::vector<std::string>& strategies,
                                std::vector<std::string>& notes) {
  const MeasuredStep m = measure_step(base);
  const std::int64_t samples = base.integer("train_samples").value_or(0);
  const std::int64_t batch = base.integer("batch_size").value_or(1) * base.integer("grad_accum").value_or(1);
  const std::int64_t max_steps = base.integer("max_steps").value_or(0);
  const bool drop_last = base.display("drop_last") == "true";
  const std::int64_t epochs = base.integer("epochs").value_or(1);
  const std::vector<double> buckets =
      gradient_buckets(m.gradient_bytes, base.real("first_bucket_mb").value_or(1.0) * 1024 * 1024,
                       base.real("bucket_mb").value_or(25.0) * 1024 * 1024);
  std::vector<Prediction> out;
  for (const std::string& strategy : strategies) {
    std::vector<const results::RunRecord*> same_strategy;
    for (const auto* r : multi_rank) {
      if (r->display("strategy") == strategy) same_strategy.push_back(r);
    }
    const MeasuredScaling scaling = measure_scaling(same_strategy.empty() ? multi_rank : same_strategy);
    double one_rank_total = NAN;
    for (const int n : ranks) {
      Prediction p;
      p.base = &base;
      p.strategy = strategy;
      p.ranks = n;
      p.scaling = n > 1 ? scaling : MeasuredScaling{};
      const AllReduceCost* cost = nullptr;
      std::optional<AllReduceCost> assumed;
      for (const auto& c : costs) {
        if (c.world_size() == n) cost = &c;
      }
      if (n > 1 && cost == nullptr) {
        if (link == nullptr) {
          notes.push_back(
              fmt::format("{} ranks skipped: no comm run at {} ranks (mpirun -np {} mgbench comm) and no "
                          "--link assumption",
                          n, n, n));
          continue;
        }
        assumed.emplace(n, *link);
        cost = &*assumed;
      }
      p.comm_source = n > 1 ? cost->source() : "none (1 rank)";
      p.steps = steps_per_epoch(strategy, samples, batch, n, max_steps, drop_last);
      // ddp-rr: every rank loads and copies every batch (loop.cpp charges them to its next step).
      const double loads = strategy == "ddp-rr" ? n : 1;
      p.compute_s = m.h2d_s * loads + m.transform_s + m.forward_s + m.backward_s + m.optimizer_s + m.other_s;
      p.data_s = m.data_s * loads;
      double allreduce = 0;
      if (n > 1) {
        for (const double bytes : buckets) allreduce += cost->seconds(bytes);
      }
      p.allreduce_s = allreduce * (1.0 - p.scaling.overlap);
      p.epoch_s = static_cast<double>(p.steps) * (p.compute_s + p.data_s + p.allreduce_s) * p.scaling.spread;
      p.eval_s = m.eval_s / n;
      p.evaluated_epochs = m.evaluated_epochs;
      p.total_s =
          static_cast<double>(epochs) * p.epoch_s + static_cast<double>(m.evaluated_epochs) * p.eval_s + m.startup_s;
      if (n == 1) one_rank_total = p.total_s;
      const std::vector<std::pair<const char*, double>> phases = {
          {"data", p.data_s},          {"h2d", m.h2d_s * loads},   {"transform", m.transform_s},
          {"forward", m.forward_s},    {"backward", m.backward_s}, {"allreduce", p.allreduce_s},
          {"optimizer", m.optimizer_s}};
      p.limiting = std::max_element(phases.begin(), phases.end(), [](const auto& a, const auto& b) {
                     return a.second < b.second;
                   })->first;
      out.push_back(std::move(p));
    }
    // T(1 rank) of the same model (the base's own configuration at 1 rank).
    if (!std::isfinite(one_rank_total)) {
      const std::int64_t steps1 = steps_per_epoch(strategy, samples, batch, 1, max_steps, drop_last);
      one_rank_total = static_cast<double>(epochs * steps1) * (m.h2d_s + m.transform_s + m.forward_s + m.backward_s +
                                                               m.optimizer_s + m.other_s + m.data_s) +
                       static_cast<double>(m.evaluated_epochs) * m.eval_s + m.startup_s;
    }
    for (auto& p : out) {
      if (p.strategy == strategy) p.speedup = one_rank_total / p.total_s;
    }
  }
  return out;
}

void print_predictions(std::ostream& out, const std::vector<Prediction>& predictions) {
  if (predictions.empty()) return;
  const auto& base = *predictions.front().base;
  const std::string what = base.display("image_size").empty()
                               ? fmt::format("{} on {}", base.display("model"), base.display("dataset"))
                               : fmt::format("{} px", base.display("image_size"));
  out << fmt::format(
      "# PREDICTION (mgbench predict) of {} ({}): {} {} ({}), {}, batch {} x {}, {} epoch(s), {} samples\n",
      base.run_id, base.file, base.display("task"), what, base.display("recipe"), base.display("precision"),
      base.display("batch_size"), base.display("grad_accum"), base.display("epochs"), base.display("train_samples"));
  const char* row = "{:>5} {:<7} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:<10} {}\n";
  out << "# "
      << fmt::format(fmt::runtime(row), "ranks", "strat", "steps", "compute", "data", "allreduce", "epoch", "total",
                     "speedup", "par_eff", "limiting", "comm");
  out << "# "
      << fmt::format(fmt::runtime(row), "", "", "(/rank)", "(ms/step)", "(ms/step)", "(ms/step)", "(s)", "(s)", "(x)",
                     "(%)", "", "");
  for (const auto& p : predictions) {
    out << "  "
        << fmt::format(fmt::runtime(row), p.ranks, p.strategy, p.steps, number(p.compute_s * 1e3, 2),
                       number(p.data_s * 1e3, 2), number(p.allreduce_s * 1e3, 2), number(p.epoch_s, 2),
                       number(p.total_s, 2), number(p.speedup, 2), number(100 * p.speedup / p.ranks, 1), p.limiting,
                       p.comm_source);
  }
  for (const auto& p : predictions) {
    if (p.ranks > 1 && !p.scaling.sources.empty()) {
      out << fmt::format("# {} {} ranks: overlap {:.1f} %, straggler spread {:.3f} measured in {}\n", p.strategy,
                         p.ranks, 100 * p.scaling.overlap, p.scaling.spread, fmt::join(p.scaling.sources, ", "));
      break;
    }
  }
}

std::string workload_of(const results::RunRecord& r) {
  std::string task = r.display("task");
  if (task == "prediction") task = r.display("predicted_task");
  return fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", task, r.display("recipe"), r.display("device"),
                     r.display("precision"), r.display("pin_memory"), r.display("image_size"), r.display("width_mult"),
                     r.display("model"), r.display("dataset"), r.display("epochs"), r.display("batch_size"),
                     r.display("grad_accum"), r.display("train_samples"), r.display("max_steps"));
}

bool is_prediction_run(const results::RunRecord& run) { return run.display("task") == "prediction"; }

void print_prediction_check(std::ostream& out, const std::vector<results::RunRecord>& runs, bool csv) {
  if (csv) {
    out << "file,run_id,ranks,strategy,precision,image_size,predicted_total_s,measured_run_id,measured_total_s,"
           "error_pct\n";
  } else {
    out << "# PREDICTIONS (mgbench predict) beside the measured run of the same workload, strategy and rank count; "
           "error = (predicted - measured) / measured\n";
  }
  const char* row = "{:<36} {:>5} {:<7} {:<9} {:>5} {:>10} {:>10} {:>8} {:<28}\n";
  if (!csv) {
    out << "# "
        << fmt::format(fmt::runtime(row), "prediction", "ranks", "strat", "precision", "size", "predicted", "measured",
                       "error", "measured run");
    out << "# " << fmt::format(fmt::runtime(row), "", "", "", "", "(px)", "(s)", "(s)", "(%)", "");
  }
  for (const auto& p : runs) {
    if (!is_prediction_run(p)) continue;
    const results::RunRecord* measured = nullptr;
    for (const auto& m : runs) {
      if (is_prediction_run(m) || m.display("task") == "comm" || !is_completed(m)) continue;
      if (workload_of(m) == workload_of(p) && m.display("strategy") == p.display("strategy") &&
          m.integer("world_size") == p.integer("world_size")) {
        measured = &m;  // the latest
      }
    }
    const double error =
        measured != nullptr ? 100.0 * (p.summary.total_s - measured->summary.total_s) / measured->summary.total_s : NAN;
    if (csv) {
      out << fmt::format("{},{},{},{},{},{},{:.6g},{},{},{}\n", p.file, p.run_id, p.display("world_size"),
                         p.display("strategy"), p.display("precision"), p.display("image_size"), p.summary.total_s,
                         measured != nullptr ? measured->run_id : "",
                         measured != nullptr ? number(measured->summary.total_s, 3) : "-", number(error, 2));
    } else {
      out << "  "
          << fmt::format(fmt::runtime(row), p.run_id, p.display("world_size"), p.display("strategy"),
                         p.display("precision"), p.display("image_size"), number(p.summary.total_s, 2),
                         measured != nullptr ? number(measured->summary.total_s, 2) : "-", number(error, 1),
                         measured != nullptr ? measured->run_id : "(not measured)");
    }
  }
}

}  // namespace mgbench::report
