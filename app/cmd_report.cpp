// `mgbench report`: tables from results files. Never initialises MPI and needs no LibTorch (see mgbench-report).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "options.h"
#include "plot_paths.h"
#include "report/predict.h"
#include "report/report.h"
#include "results_files.h"

extern char** environ;

namespace mgbench::app {
namespace {

/// Writes the figures and index.html of `files` into `directory` with mgbench-plot (the Python package
/// mgbench_analysis): the source tree's package run by the configured Python where both exist (so the
/// figures always match this build), `mgbench-plot` from PATH otherwise. Returns the exit status to
/// report: 0, or 1 with a message saying how to install the package.
int write_figures(const std::vector<std::string>& files, const std::string& directory) {
  std::vector<std::string> args;
  const std::filesystem::path package = std::filesystem::path(plot_paths::kPackageDir) / "mgbench_analysis";
  if (std::filesystem::exists(package / "cli.py") && access(plot_paths::kPython, X_OK) == 0) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string path =
        std::string(plot_paths::kPackageDir) + (old != nullptr && *old ? ":" + std::string(old) : "");
    setenv("PYTHONPATH", path.c_str(), 1);
    args = {plot_paths::kPython, "-m", "mgbench_analysis.cli"};
  } else {
    args = {"mgbench-plot"};
  }
  args.insert(args.end(), files.begin(), files.end());
  args.insert(args.end(), {"--out", directory, "--html", directory});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
  int status = 0;
  if (rc == 0) waitpid(pid, &status, 0);
  if (rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::cerr << "mgbench report --plot: " << args[0]
              << (rc != 0 ? std::string(" could not be started: ") + std::strerror(rc)
                          : " failed (its message is above)")
              << "\n  the figures need the Python package mgbench_analysis and its dependencies (h5py, numpy, "
                 "pandas, matplotlib):\n  pip install "
              << plot_paths::kPackageDir << "   (scripts/install-deps.sh installs it into the project venv)\n";
    return 1;
  }
  return 0;
}

}  // namespace

int report_main(int argc, char** argv) {
  po::options_description options(
      "mgbench report: one row per run (ranks, strategy, precision, pin_memory, image size, total time,\n"
      "test accuracy, efficiency vs 1 rank and vs FP64).\nusage: mgbench report [--csv] [--phases] [--cuda] [--plot "
      "DIR] "
      "FILE|DIR|'PATTERN'...\n"
      "  DIR: every *.h5 below it; PATTERN: a quoted shell glob (e.g. 'outputs/*/results.h5'), expanded here.\n");
  options.add_options()("csv", "comma-separated values instead of the table")(
      "phases",
      "also show, per run, the training time by phase (min / avg / max across ranks) and the all-reduce overlap")(
      "cuda", "also show, per run, the CUDA metrics (CUPTI: HtoD copies, API calls, kernels, NCCL, peak memory)")(
      "plot", po::value<std::string>()->value_name("DIR"),
      "also write every figure the runs support, and DIR/index.html with the figures and tables, into DIR "
      "(mgbench-plot, the Python package in python/)")("help,h", "show this help");
  po::options_description hidden;
  hidden.add_options()("files", po::value<std::vector<std::string>>()->composing(), "results files");
  po::options_description all;
  all.add(options).add(hidden);
  po::positional_options_description positional;
  positional.add("files", -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "mgbench report: " << error_text(e) << "\n";
    return 2;
  }
  if (vm.count("help") != 0) {
    std::cout << options << "\n";
    return 0;
  }
  if (vm.count("files") == 0) {
    std::cerr << "mgbench report: no results file given\n" << options << "\n";
    return 2;
  }
  std::vector<std::string> files;
  std::vector<results::RunRecord> runs;
  try {
    files = expand_results_files(vm["files"].as<std::vector<std::string>>());
    runs = read_results_files(files);
  } catch (const Error& e) {
    std::cerr << "mgbench report: " << e.what() << "\n";
    return 1;
  }
  const auto format = vm.count("csv") != 0 ? report::Format::kCsv : report::Format::kTable;
  std::vector<results::RunRecord> image_runs, llm_runs, comm_runs;
  bool predictions = false;
  for (auto& r : runs) {
    if (report::is_prediction_run(r)) {
      predictions = true;  // shown beside the measured runs below, never a baseline of theirs
      continue;
    }
    (report::is_llm_run(r) ? llm_runs : report::is_comm_run(r) ? comm_runs : image_runs).push_back(r);
  }
  if (!image_runs.empty() || (llm_runs.empty() && comm_runs.empty() && !predictions)) {
    report::print(std::cout, report::build_rows(image_runs), format);
  }
  if (!llm_runs.empty()) {
    if (!image_runs.empty()) std::cout << "\n";
    report::print_llm(std::cout, llm_runs, format);
    if (std::any_of(llm_runs.begin(), llm_runs.end(), report::is_dpo_run)) {
      std::cout << "\n";
      report::print_dpo(std::cout, llm_runs, format);
    }
  }
  if (!comm_runs.empty()) {
    if (!image_runs.empty() || !llm_runs.empty()) std::cout << "\n";
    report::print_comm(std::cout, comm_runs, format);
  }
  if (predictions) {
    std::cout << "\n";
    report::print_prediction_check(std::cout, runs, format == report::Format::kCsv);
  }
  if (vm.count("phases") != 0) {
    std::cout << "\n";
    std::vector<results::RunRecord> trained;  // the runs with training phases
    for (const auto& r : runs) {
      if (!report::is_comm_run(r) && !report::is_prediction_run(r)) trained.push_back(r);
    }
    report::print_phases(std::cout, trained);
  }
  if (vm.count("cuda") != 0) {
    std::cout << "\n";
    report::print_cuda(std::cout, runs);
  }
  if (vm.count("plot") != 0) return write_figures(files, vm["plot"].as<std::string>());
  return 0;
}

}  // namespace mgbench::app
