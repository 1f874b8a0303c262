// `mgbench predict`: time per epoch and per run, speed-up and the limiting phase of measured workloads
// at other rank counts and strategies (report/predict.h has the model), printed and written into a
// results file as runs of task `prediction`. A single process; no GPU needed.
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "commands.h"
#include "core/error.h"
#include "core/timer.h"
#include "options.h"
#include "report/predict.h"
#include "report/report.h"
#include "results/writer.h"
#include "results_files.h"
#include "runtime/mpi_env.h"

namespace mgbench::app {
namespace {

std::vector<int> parse_ranks(const std::string& text) {
  std::vector<int> ranks;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    int n = 0;
    std::size_t used = 0;
    try {
      n = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || n < 1) options::fail("ranks", text, "comma-separated rank counts >= 1 (1,2,4)");
    ranks.push_back(n);
  }
  if (ranks.empty()) options::fail("ranks", text, "comma-separated rank counts >= 1 (1,2,4)");
  return ranks;
}

std::vector<std::string> parse_strategies(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (item != "ddp" && item != "ddp-rr" && item != "ddp-ds") {
      options::fail("strategies", text, "comma-separated ddp, ddp-rr, ddp-ds");
    }
    out.push_back(item);
  }
  if (out.empty()) options::fail("strategies", text, "comma-separated ddp, ddp-rr, ddp-ds");
  return out;
}

/// A measured training run (not a comm run, a prediction or an evaluation).
bool usable(const results::RunRecord& r) {
  return report::is_completed(r) && !report::is_prediction_run(r) && !report::is_comm_run(r) &&
         r.display("task") != "llm-eval";
}

/// The prediction as a run: the base's attributes, then what was predicted and from what.
h5::Attributes prediction_attributes(const report::Prediction& p, const std::string& command_line) {
  h5::Attributes a = p.base->attributes;
  h5::merge_attributes(
      a, {{"task", std::string("prediction")},
          {"predicted_task", p.base->display("task")},
          {"strategy", p.strategy},
          {"world_size", static_cast<std::int64_t>(p.ranks)},
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
          {"prediction_limiting_phase", p.limiting},
          {"prediction_speedup", p.speedup},
          {"prediction_model", std::string("mgbench predict v1 (docs/design.md, The scaling predictor)")}});
  // What belonged to the measured run's own history.
  std::erase_if(a, [](const auto& attr) { return attr.first == "resumes" || attr.first == "resumed_utc"; });
  return a;
}

}  // namespace

int predict_main(int argc, char** argv) {
  std::string ranks_text = "1,2,3,4", strategies_text = "ddp,ddp-rr,ddp-ds", link_name,
              results_path = "outputs/results.h5";
  std::vector<std::string> comm_files;
  po::options_description options(
      "mgbench predict: time per epoch and per run, speed-up and the limiting phase of measured workloads at other "
      "rank counts and strategies, from each workload's completed 1-rank run and the all-reduce of a `mgbench comm` "
      "run at each rank count (model: docs/design.md, The scaling predictor). Prints the predictions and appends "
      "them to --results as runs of task `prediction`; `mgbench report` then shows each beside its measured run.\n"
      "usage: mgbench predict FILE|DIR|'PATTERN'... [--comm FILE...] [--ranks 1,2,4] [--link h100-nvlink]\n");
  options.add_options()("ranks", po::value(&ranks_text), "rank counts to predict, comma-separated (1,2,3,4)")(
      "strategies", po::value(&strategies_text), "strategies to predict (ddp,ddp-rr,ddp-ds)")(
      "comm", po::value(&comm_files)->composing(),
      "results files with `mgbench comm` runs (comm runs among FILE... are used too)")(
      "link", po::value(&link_name),
      "where no comm run was measured at a rank count, assume this link: h100-nvlink or h100-pcie (labelled as an "
      "assumption)")("results", po::value(&results_path), "results file the predictions are appended to")(
      "help,h", "show this help");
  po::options_description hidden;
  hidden.add_options()("files", po::value<std::vector<std::string>>()->composing(), "results files");
  po::options_description all;
  all.add(options).add(hidden);
  po::positional_options_description positional;
  positional.add("files", -1);
  po::variables_map vm;
  std::vector<int> ranks;
  std::vector<std::string> strategies;
  const report::LinkAssumption* link = nullptr;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(positional).run(), vm);
    po::notify(vm);
    if (vm.count("help") != 0) {
      std::cout << options << "\n";
      return 0;
    }
    if (vm.count("files") == 0) throw ConfigError("no results file with measured runs given");
    ranks = parse_ranks(ranks_text);
    strategies = parse_strategies(strategies_text);
    if (!link_name.empty()) link = &report::link_assumption(link_name);
  } catch (const po::error& e) {
    std::cerr << "mgbench predict: " << error_text(e) << "\n(see mgbench predict --help)\n";
    return 2;
  } catch (const ConfigError& e) {
    std::cerr << "mgbench predict: " << e.what() << "\n(see mgbench predict --help)\n";
    return 2;
  }
  std::vector<results::RunRecord> runs;
  try {
    std::vector<std::string> files = expand_results_files(vm["files"].as<std::vector<std::string>>());
    if (!comm_files.empty()) {
      const auto more = expand_results_files(comm_files);
      files.insert(files.end(), more.begin(), more.end());
    }
    runs = read_results_files(files);
  } catch (const Error& e) {
    std::cerr << "mgbench predict: " << e.what() << "\n";
    return 1;
  }

  // The bases: per workload and strategy, the latest completed 1-rank run of that strategy, else of
  // any strategy (at 1 rank the strategies compute the same).
  std::map<std::string, std::vector<const results::RunRecord*>> one_rank, multi_rank;
  std::vector<std::string> workloads;
  for (const auto& r : runs) {
    if (!usable(r)) continue;
    const std::string w = report::workload_of(r);
    if (r.integer("world_size").value_or(1) == 1) {
      if (one_rank.find(w) == one_rank.end()) workloads.push_back(w);
      one_rank[w].push_back(&r);
    } else {
      multi_rank[w].push_back(&r);
    }
  }
  if (workloads.empty()) {
    std::cerr << "mgbench predict: no completed 1-rank run of `mgbench image` or `mgbench llm` among the files: "
                 "measure the workload on 1 rank first\n";
    return 1;
  }
  std::vector<report::Prediction> all_predictions;
  std::vector<std::string> notes;
  for (const auto& w : workloads) {
    std::vector<report::Prediction> of_workload;
    try {
      for (const auto& strategy : strategies) {
        const results::RunRecord* base = one_rank[w].back();
        for (const auto* r : one_rank[w]) {
          if (r->display("strategy") == strategy) base = r;
        }
        std::string dtype = base->display("precision");
        if (dtype != "fp64" && dtype != "fp16" && dtype != "bf16") dtype = "fp32";  // the gradients' dtype
        const std::string device = base->display("device");
        auto costs = report::all_reduce_costs(runs, dtype, device);
        if (costs.empty() && dtype != "fp32") {
          costs = report::all_reduce_costs(runs, "fp32", device);
          if (!costs.empty()) notes.push_back(fmt::format("no {} all-reduce measured: fp32 rows used by size", dtype));
        }
        if (costs.empty()) {
          notes.push_back(
              fmt::format("no completed comm run on {} among the files (mpirun -np N mgbench comm --device "
                          "{}): only --link can stand in",
                          device, device));
        }
        auto p = report::predict(*base, multi_rank[w], costs, link, ranks, {strategy}, notes);
        of_workload.insert(of_workload.end(), p.begin(), p.end());
      }
    } catch (const Error& e) {
      // One workload that cannot be predicted (a run of an older mgbench) leaves the others.
      notes.push_back(fmt::format("workload of {} not predicted: {}", one_rank[w].back()->run_id, e.what()));
      continue;
    }
    report::print_predictions(std::cout, of_workload);
    std::cout << "\n";
    all_predictions.insert(all_predictions.end(), of_workload.begin(), of_workload.end());
  }
  std::sort(notes.begin(), notes.end());
  notes.erase(std::unique(notes.begin(), notes.end()), notes.end());
  for (const auto& n : notes) std::cout << "# note: " << n << "\n";
  if (link != nullptr) std::cout << fmt::format("# assumption {}: {}\n", link->name, link->source);

  // Into the results file, one run per prediction (a single process: MPI_COMM_SELF).
  std::optional<runtime::MpiEnvironment> mpi;
  try {
    mpi.emplace(&argc, &argv);
    const std::string command_line = join_command_line(argc, argv);
    for (const auto& p : all_predictions) {
      // Named after what it predicts: <strategy>-<n>r-of-<the 1-rank run measured>.
      results::ResultsWriter writer(results_path, MPI_COMM_SELF,
                                    fmt::format("predicted-{}-{}r-of-{}", p.strategy, p.ranks, p.base->run_id),
                                    prediction_attributes(p, command_line), {{"rank", std::int64_t{0}}}, {});
      results::RunSummary s;
      s.total_s = p.total_s;
      s.train_s = p.epoch_s * static_cast<double>(p.base->integer("epochs").value_or(1));
      s.eval_s = p.eval_s * static_cast<double>(p.evaluated_epochs);  // as a measured run's: the sum
      s.s_per_it = p.steps > 0 ? p.epoch_s / static_cast<double>(p.steps) : NAN;
      s.epochs_completed = p.base->integer("epochs").value_or(1);
      s.finished_unix_s = static_cast<double>(std::time(nullptr));
      writer.write_summary(s);
      writer.finish(results::kStatusCompleted);
    }
  } catch (const Error& e) {
    std::cerr << "mgbench predict: writing " << results_path << ": " << e.what() << "\n";
    return 1;
  }
  std::cout << fmt::format(
      "# {} prediction(s) appended to {} (task prediction; mgbench report shows them beside "
      "the measured runs)\n",
      all_predictions.size(), results_path);
  return 0;
}

}  // namespace mgbench::app
