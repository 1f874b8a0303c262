// `mgbench predict`'s tables: the predictions of a workload ('#' header and units rows, as the
// report's), then the plan's notes and its link assumption.
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "report/predict.h"
#include "report/table.h"

namespace mgbench::report {

void print_predictions(std::ostream& out, const std::vector<Prediction>& predictions) {
  if (predictions.empty()) return;
  const auto& base = *predictions.front().base;
  const std::string what = base.display("image_size").empty()
                               ? fmt::format("{} on {}", base.display("model"), base.display("dataset"))
                               : fmt::format("{} px", base.display("image_size"));
  const std::string sharding = base.display("sharding").empty() ? "" : ", sharding " + base.display("sharding");
  out << fmt::format(
      "# PREDICTION (mgbench predict) of {} ({}): {} {} ({}), {}, batch {} x {}, {} epoch(s), {} samples{}\n",
      base.run_id, base.file, base.display("task"), what, base.display("recipe"), base.display("precision"),
      base.display("batch_size"), base.display("grad_accum"), base.display("epochs"), base.display("train_samples"),
      sharding);
  using P = Prediction;
  auto ms = [](double P::*field) { return [field](const P& p) { return number(p.*field * 1e3, 2); }; };
  auto s = [](double P::*field) { return [field](const P& p) { return number(p.*field, 2); }; };
  const std::vector<Column<P>> columns = {
      {"ranks", "", 5, "", [](const P& p) { return std::to_string(p.ranks); }},
      {"nodes", "", 5, "", [](const P& p) { return std::to_string(p.nodes); }},
      {"strat", "", -7, "", [](const P& p) { return std::string(p.strategy->name); }},
      {"steps", "(/rank)", 7, "", [](const P& p) { return std::to_string(p.steps); }},
      {"compute", "(ms/step)", 10, "", ms(&P::compute_s)},
      {"data", "(ms/step)", 10, "", ms(&P::data_s)},
      {"allreduce", "(ms/step)", 10, "", ms(&P::allreduce_s)},
      {"allgather", "(ms/step)", 10, "", ms(&P::allgather_s)},
      {"r-scatter", "(ms/step)", 10, "", ms(&P::reducescatter_s)},
      {"bcast+lred", "(ms/step)", 10, "",
       [](const P& p) { return number((p.buffer_broadcast_s + p.loss_reduce_s) * 1e3, 2); }},
      {"link", "(MiB/step)", 10, "", [](const P& p) { return number(p.link_bytes / (1024.0 * 1024.0), 2); }},
      {"epoch", "(s)", 10, "", s(&P::epoch_s)},
      {"total", "(s)", 10, "", s(&P::total_s)},
      {"speedup", "(x)", 8, "", s(&P::speedup)},
      {"par_eff", "(%)", 8, "", [](const P& p) { return number(100 * p.speedup / p.ranks, 1); }},
      {"limiting", "", -10, "", [](const P& p) { return p.limiting; }},
      {"comm", "", 0, "", [](const P& p) { return p.comm_source; }},
  };
  write_table(out, columns, predictions, /*csv=*/false);
  for (std::size_t i = 0; i < predictions.size(); ++i) {
    const Prediction& p = predictions[i];
    if (i > 0 && p.base == predictions[i - 1].base) continue;
    out << fmt::format(
        "# {}: warm-up {:.3f} s once per run (its first step beyond its steady step), in total, not in compute\n",
        p.base->run_id, p.warmup_s);
  }
  if (const auto& model = predictions.front().model) {
    out << fmt::format(
        "# model {} in place of the measured {}: forward, backward and evaluation x {:.3f} (FLOPs a position, samples "
        "of {:.0f} "
        "padded tokens), optimizer and gradients x {:.3f} (trained parameters){}; data, copies, start-up and "
        "warm-up as measured\n",
        model->model, model->base_model, model->compute_factor, model->padded_tokens_per_sample,
        model->optimizer_factor,
        parallel_plan_of(*predictions.front().base).sharding == axes::Sharding::kFsdp
            ? fmt::format(", FSDP's {} all-gathers and {} reduce-scatters a micro-batch its own",
                          model->allgather_bytes.size(), model->reducescatter_bytes.size())
            : "");
    std::vector<std::string> planned;
    for (const auto& [ranks, bytes] : model->memory_bytes_per_rank) {
      planned.push_back(fmt::format("{} rank(s) {:.1f} GiB", ranks, bytes / (1024.0 * 1024.0 * 1024.0)));
    }
    out << fmt::format(
        "# {} a rank holds (--dry-run's plan: parameters, gradients, optimizer states, activations): {}\n",
        model->model, fmt::join(planned, ", "));
  }
  for (const auto& p : predictions) {
    if (parallel_plan_of(*p.base).at(p.ranks).fully_sharded()) {
      const MeasuredStep m = p.model ? rescaled(measure_step(*p.base), *p.model) : measure_step(*p.base);
      out << fmt::format(
          "# fsdp: per micro-batch {} all-gathers and {} reduce-scatters as {}; the share hidden behind compute "
          "as measured for each placement below (none measured: all exposed)\n",
          m.allgather_bytes.size(), m.reducescatter_bytes.size(),
          p.model ? "its units issue them" : "the base recorded them");
      break;
    }
  }
  // Each placement learns from the other placements' runs (predict): its own line.
  for (const auto& p : predictions) {
    if (p.ranks > 1 && !p.scaling.sources.empty()) {
      out << fmt::format(
          "# {} {} ranks on {} node(s): overlap {:.1f} %, straggler spread {:.3f}, contention {:.3f}{} measured in "
          "{}\n",
          p.strategy->name, p.ranks, p.nodes, 100 * p.scaling.overlap, p.scaling.spread, p.scaling.contention,
          parallel_plan_of(*p.base).at(p.ranks).fully_sharded()
              ? fmt::format(", FSDP's collectives {:.1f} % hidden", 100 * p.fsdp_overlap)
              : "",
          fmt::join(p.scaling.sources, ", "));
    }
  }
}

void print_plan(std::ostream& out, const PredictionPlan& plan) {
  for (const auto& predictions : plan.workloads) {
    print_predictions(out, predictions);
    out << "\n";
  }
  for (const auto& n : plan.notes) out << "# note: " << n << "\n";
  if (plan.link != nullptr) out << fmt::format("# assumption {}: {}\n", plan.link->name, plan.link->source);
}

}  // namespace mgbench::report
