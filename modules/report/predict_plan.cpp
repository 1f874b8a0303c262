// `mgbench predict` as a command: its options, the plan that predicts every workload of the files
// (each from its completed 1-rank run of median time, its collectives priced by the comm runs among them),
// and the predictions appended to a results file as runs of task `prediction`.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <iterator>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/timer.h"
#include "report/predict.h"
#include "report/reference.h"
#include "report/report.h"
#include "report/workload.h"
#include "results/writer.h"

namespace mgbench::report {

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
                   std::all_of(v.begin(), v.end(), [](std::int64_t n) { return n >= 1 && n <= kMaxRanks; }) &&
                   std::set<std::int64_t>(v.begin(), v.end()).size() == v.size();
          },
          fmt::format("comma-separated rank counts from 1 to {}, each once (1,2,4)", kMaxRanks));
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
      .at_least(0)
      .at_most(kMaxRanks);
  t.add("strategies", strategies, std::span<const axes::StrategyInfo>(multi_rank), "strategies to predict")
      .check(
          [](const std::vector<axes::Strategy>& v) {
            return !v.empty() && std::set<axes::Strategy>(v.begin(), v.end()).size() == v.size();
          },
          "comma-separated strategies, each once (ddp,ddp-ds)");
  t.add("link", link,
        "where no comm run was measured at a rank count, assume this link (labelled as an assumption): " + link_names())
      .check([](const std::string& name) { return name.empty() || find_link(name) != nullptr; }, link_names());
  t.add("model", model,
        "price each LLM run's step for this Llama model instead (a preset such as llama3.1-70b, or a directory with "
        "config.json): its FLOPs, trained parameters and FSDP collectives from its shapes, with the run's recipe and "
        "options; the data, the start-up and the warm-up as measured (docs/design.md, The scaling predictor)")
      .value_name("NAME|DIR");
  t.add("results", results, "results file the predictions are appended to")
      .check([](const std::string& path) { return !path.empty(); }, "a file path");
}

namespace {

/// A measured training run (not a comm run, a prediction or an evaluation).
bool usable(const results::RunRecord& r) {
  return is_completed(r) && !is_prediction_run(r) && !is_comm_run(r) && r.display("task") != "llm-eval";
}

/// The predictions of one workload at every strategy asked: each from the completed 1-rank run of
/// that strategy, else of any, of median total time among repeats (median_run).
std::vector<Prediction> predict_workload(const std::vector<results::RunRecord>& runs,
                                         const std::vector<const results::RunRecord*>& one_rank,
                                         const std::vector<const results::RunRecord*>& multi_rank,
                                         const PredictOptions& o, const LinkAssumption* link, const ModelScaler& scaler,
                                         std::vector<std::string>& notes) {
  std::vector<Prediction> out;
  MGBENCH_REQUIRE(o.model.empty() || static_cast<bool>(scaler), ConfigError,
                  "--model: this program cannot compute a model's shapes (mgbench predict can)");
  for (const axes::Strategy strategy : o.strategies) {
    std::vector<const results::RunRecord*> of_strategy;
    for (const auto* r : one_rank) {
      if (r->display("strategy") == axes::strategy_info(strategy).name) of_strategy.push_back(r);
    }
    const results::RunRecord* base = median_run(of_strategy.empty() ? one_rank : of_strategy);
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
    // --model: the base's own job with the other model (its padded tokens, its options).
    const std::optional<ModelScaling> model =
        o.model.empty() ? std::nullopt : std::optional<ModelScaling>(scaler(*base, o.model, o.ranks));
    auto p = predict(*base, multi_rank, costs, link, o.ranks, o.ranks_per_node, {strategy}, notes,
                     model ? &*model : nullptr);
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
          {"prediction_contention", p.scaling.contention},
          {"prediction_scaling_runs", fmt::format("{}", fmt::join(p.scaling.sources, ","))},
          {"prediction_steps_per_epoch", p.steps},
          {"prediction_compute_s_per_step", p.compute_s},
          {"prediction_warmup_s", p.warmup_s},
          {"prediction_data_s_per_step", p.data_s},
          {"prediction_allreduce_s_per_step", p.allreduce_s},
          {"prediction_allgather_s_per_step", p.allgather_s},
          {"prediction_reducescatter_s_per_step", p.reducescatter_s},
          {"prediction_fsdp_overlap", p.fsdp_overlap},
          {"prediction_link_bytes_per_step", p.link_bytes},
          {"prediction_buffer_broadcast_s_per_step", p.buffer_broadcast_s},
          {"prediction_loss_reduce_s_per_step", p.loss_reduce_s},
          {"prediction_limiting_phase", p.limiting},
          {"prediction_speedup", p.speedup},
          {"prediction_model", std::string("mgbench predict v3 (docs/design.md, The scaling predictor)")}});
  // What belonged to the measured run's own history.
  std::erase_if(a, [](const auto& attr) { return attr.first == "resumes" || attr.first == "resumed_utc"; });
  if (p.model) {
    // Another model: what the base's attributes say of its own model's sizes does not hold for it.
    static const std::set<std::string> sizes = {"model_parameters",
                                                "decoder_layers",
                                                "weight_bytes",
                                                "weight_bytes_per_parameter",
                                                "trainable_parameters",
                                                "parameter_bytes_per_rank",
                                                "gradient_bytes_per_rank",
                                                "optimizer_state_bytes_per_rank",
                                                "activation_bytes_per_rank",
                                                "fsdp_units",
                                                "fsdp_allgather_bytes",
                                                "fsdp_reducescatter_bytes",
                                                "allreduce_buckets"};
    std::erase_if(a, [](const auto& attr) { return sizes.count(attr.first) != 0; });
    const auto planned = std::find_if(p.model->memory_bytes_per_rank.begin(), p.model->memory_bytes_per_rank.end(),
                                      [&](const auto& row) { return row.first == p.ranks; });
    h5::merge_attributes(a, {{"model", p.model->model},
                             {"prediction_from_model", p.model->base_model},
                             {"prediction_compute_factor", p.model->compute_factor},
                             {"prediction_optimizer_factor", p.model->optimizer_factor},
                             {"prediction_padded_tokens_per_sample", p.model->padded_tokens_per_sample},
                             {"prediction_memory_bytes_per_rank",
                              planned != p.model->memory_bytes_per_rank.end() ? planned->second : results::kNaN}});
  }
  return a;
}

}  // namespace

PredictionPlan plan_predictions(const std::vector<results::RunRecord>& runs, const PredictOptions& o,
                                const ModelScaler& scaler) {
  PredictionPlan plan;
  if (!o.link.empty()) plan.link = &link_assumption(o.link);
  // Per workload, in the files' order: its 1-rank runs (the bases) and its multi-rank runs.
  std::map<std::string, std::vector<const results::RunRecord*>> one_rank, multi_rank;
  std::vector<std::string> workloads;
  for (const auto& r : runs) {
    if (!usable(r)) continue;
    const std::string w = workload_identity(r);
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
      plan.workloads.push_back(predict_workload(runs, one_rank[w], multi_rank[w], o, plan.link, scaler, plan.notes));
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
      s.train_s = p.epoch_s * static_cast<double>(epochs) + p.warmup_s;
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
