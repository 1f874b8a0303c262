#include "report/commands.h"

#include <sys/stat.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "report/figures.h"
#include "report/paper_table.h"
#include "report/reference.h"
#include "report/repeats.h"
#include "report/report.h"
#include "results/files.h"

namespace mgbench::report {

void ReportOptions::declare(options::OptionTable& t) {
  t.add("files", files, "results files (files, directories: every *.h5 below, quoted patterns such as 'outputs/*.h5')")
      .positional()
      .required()
      .value_name("FILE...");
  t.add("csv", csv, "comma-separated values instead of the table").as_switch();
  t.add("phases", phases,
        "also show, per run, the training time by phase (min / avg / max across ranks) and the all-reduce overlap")
      .as_switch();
  t.add("cuda", cuda,
        "also show, per run, the CUDA metrics (CUPTI: HtoD copies, API calls, kernels, NCCL, peak memory)")
      .as_switch();
  t.add("energy", energy,
        "also show, per run, the energy (J/sample, J/token), power, SM clock, temperature and throttling "
        "(runs with --telemetry)")
      .as_switch();
  t.add("paper", paper,
        "also show every cell of the papers' tables (2503.15252 Tables 2, 3, 5; 2505.22905's headline figures) beside "
        "mgbench's median at the same setting, the ratio, the card, measured / projected / predicted / not run")
      .as_switch();
  t.add("plot", plot,
        "also write every figure the runs support, and DIR/index.html with the figures and tables, into DIR "
        "(mgbench-plot, the Python package in python/)")
      .not_empty_when_given("a directory")
      .value_name("DIR");
  // --reference prints its comparison alone: the report's tables, breakdowns and figures are not made.
  const auto report = [this] { return reference.empty(); };
  const std::string without_reference = "a report (not with --reference)";
  for (const char* name : {"phases", "cuda", "energy", "paper", "plot"}) t.only_with(name, report, without_reference);
  t.add("reference", reference,
        "compare FILES with the runs of these results files (comma-separated; directories and patterns as FILES) "
        "instead: per workload and metric the medians, their ratio and a verdict; exit 0 all hold, 1 a regression, "
        "2 a run of either side that did not complete, or bad input (a nightly regression check)")
      .not_empty_when_given("results files (an empty REF compares nothing)")
      .value_name("REF[,REF...]");
  t.add("tolerance", tolerance_pct,
        "with --reference: how much slower than the reference a run may be [%] (10 or 10%): a time or size may "
        "grow to (1 + PCT/100) x the reference's, a rate fall to 1 / (1 + PCT/100) of it")
      .above(0.0)
      .accepts_suffix("%")
      .value_name("PCT")
      .only_with([this] { return !reference.empty(); }, "--reference");
}

namespace {

int run_reference(const ReportOptions& o, std::ostream& out, std::ostream& err) {
  constexpr int kBadInput = 2;
  std::vector<results::RunRecord> reference, runs;
  try {
    const std::vector<std::string> reference_files = results::expand_results_files(o.reference);
    const std::vector<std::string> files = results::expand_results_files(o.files);
    // A file on both sides judges its runs by themselves: every metric holds (a REF directory that
    // holds tonight's file pooled it into the reference too).
    // Files are the same where their device and inode are (std::filesystem::equivalent's test), one
    // lookup each: nightly directories of many files are not compared pair by pair.
    std::map<std::pair<dev_t, ino_t>, std::string> reference_ids;
    struct stat st {};
    for (const auto& ref : reference_files) {
      if (::stat(ref.c_str(), &st) == 0) reference_ids.emplace(std::pair{st.st_dev, st.st_ino}, ref);
    }
    for (const auto& file : files) {
      if (::stat(file.c_str(), &st) != 0) continue;  // read_results_files names what cannot be read
      const auto both = reference_ids.find({st.st_dev, st.st_ino});
      if (both != reference_ids.end()) {
        err << "mgbench report --reference: '" << file << "' is among both the reference (" << both->second
            << ") and the files judged: its runs would be compared with themselves; give the reference apart\n";
        return kBadInput;
      }
    }
    reference = results::read_results_files(reference_files);
    runs = results::read_results_files(files);
  } catch (const Error& e) {
    err << "mgbench report --reference: " << e.what() << "\n";
    return kBadInput;
  }
  const double tolerance = o.tolerance_pct / 100.0;
  const ReferenceCheck check = compare_to_reference(reference, runs, tolerance);
  if (check.rows.empty()) {
    err << "mgbench report --reference: nothing to compare: no run of the files has a completed reference run of "
           "its workload\n";
    for (const auto& note : check.notes) err << "  " << note << "\n";
    return kBadInput;
  }
  print_reference(out, check, fmt::format("{}", fmt::join(o.reference, " ")), tolerance, o.csv);
  if (o.csv) {
    for (const auto& note : check.notes) err << "# " << note << "\n";  // the table's '#' lines, off the CSV
  }
  return check.exit_status();
}

}  // namespace

int run_report(const ReportOptions& o, std::ostream& out, std::ostream& err) {
  if (o.csv && (o.phases || o.cuda)) {
    // Their breakdowns are several tables and notes per run, text only: a CSV reader got those lines
    // after the runs' rows. The same values are frames of mgbench_analysis.
    err << "mgbench report: --csv with " << (o.phases ? "--phases" : "--cuda")
        << ": those breakdowns are text; their values are mgbench_analysis's frames (epochs() for the phases, "
           "cuda() for CUPTI's tables): drop --csv, or read them with Python\n";
    return 2;
  }
  if (!o.reference.empty()) return run_reference(o, out, err);
  std::vector<std::string> files;
  std::vector<results::RunRecord> runs;
  try {
    files = results::expand_results_files(o.files);
    runs = results::read_results_files(files);
  } catch (const Error& e) {
    err << "mgbench report: " << e.what() << "\n";
    return 1;
  }
  const auto format = o.csv ? Format::kCsv : Format::kTable;
  std::vector<results::RunRecord> image_runs, llm_runs, comm_runs;
  bool predictions = false;
  for (auto& r : runs) {
    if (is_prediction_run(r)) {
      predictions = true;  // shown beside the measured runs below, never a baseline of theirs
      continue;
    }
    (is_llm_run(r) ? llm_runs : is_comm_run(r) ? comm_runs : image_runs).push_back(r);
  }
  if (!image_runs.empty() || (llm_runs.empty() && comm_runs.empty() && !predictions)) {
    print(out, build_rows(image_runs), format);
  }
  if (!llm_runs.empty()) {
    if (!image_runs.empty()) out << "\n";
    print_llm(out, llm_runs, format);
    if (std::any_of(llm_runs.begin(), llm_runs.end(), is_dpo_run)) {
      out << "\n";
      print_dpo(out, llm_runs, format);
    }
  }
  if (!comm_runs.empty()) {
    if (!image_runs.empty() || !llm_runs.empty()) out << "\n";
    print_comm(out, comm_runs, format);
  }
  if (const auto repeats = repeat_rows(runs); !repeats.empty()) {
    out << "\n";
    print_repeats(out, repeats, o.csv);
  }
  if (predictions) {
    out << "\n";
    print_prediction_check(out, runs, o.csv);
  }
  if (o.phases) {
    out << "\n";
    std::vector<results::RunRecord> trained;  // the runs with training phases
    for (const auto& r : runs) {
      if (!is_comm_run(r) && !is_prediction_run(r)) trained.push_back(r);
    }
    print_phases(out, trained);
  }
  if (o.cuda) {
    out << "\n";
    print_cuda(out, runs);
  }
  if (o.energy) {
    out << "\n";
    print_energy(out, runs, o.csv);
  }
  if (o.paper) {
    out << "\n";
    print_paper(out, runs, o.csv);
  }
  if (!o.plot.empty()) {
    out.flush();
    return write_figures(files, o.plot, err);
  }
  return 0;
}

int run_predict(const PredictOptions& o, const std::string& command_line, std::ostream& out, std::ostream& err,
                const ModelScaler& scaler) {
  std::vector<results::RunRecord> runs;  // the plan points into them
  PredictionPlan plan;
  try {
    std::vector<std::string> files = results::expand_results_files(o.files);
    if (!o.comm_files.empty()) {
      const auto more = results::expand_results_files(o.comm_files);
      files.insert(files.end(), more.begin(), more.end());
    }
    runs = results::read_results_files(files);
    plan = plan_predictions(runs, o, scaler);
  } catch (const Error& e) {
    err << "mgbench predict: " << e.what() << "\n";
    return 1;
  }
  print_plan(out, plan);
  std::size_t n = 0;
  for (const auto& w : plan.workloads) n += w.size();
  if (n == 0) {  // every workload refused (the notes above say why): nothing to append, a failure
    err << "mgbench predict: nothing predicted (the notes above say why); " << o.results << " left as it was\n";
    return 1;
  }
  try {
    write_predictions(o.results, plan, command_line);
  } catch (const Error& e) {
    err << "mgbench predict: writing " << o.results << ": " << e.what() << "\n";
    return 1;
  }
  out << fmt::format(
      "# {} prediction(s) appended to {} (task prediction; mgbench report shows them beside the measured runs)\n", n,
      o.results);
  return 0;
}

}  // namespace mgbench::report
