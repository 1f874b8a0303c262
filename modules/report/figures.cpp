#include "report/figures.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "plot_paths.h"

extern char** environ;

namespace mgbench::report {

int write_figures(const std::vector<std::string>& files, const std::string& directory, std::ostream& err) {
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
  std::cout.flush();  // the tables before the child's output
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
  int status = 0;
  if (rc == 0) waitpid(pid, &status, 0);
  if (rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 2) {  // bad input, named in its message above
    err << "mgbench report --plot: no figures written into " << directory << "\n";
    return 1;
  }
  if (rc != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    err << "mgbench report --plot: " << args[0]
        << (rc != 0 ? std::string(" could not be started: ") + std::strerror(rc) : " failed (its message is above)")
        << "\n  the figures need the Python package mgbench_analysis and its dependencies (h5py, numpy, "
           "pandas, matplotlib):\n  pip install "
        << plot_paths::kPackageDir << "   (scripts/install-deps.sh installs it into the project venv)\n";
    return 1;
  }
  return 0;
}

}  // namespace mgbench::report
