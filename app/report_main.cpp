// mgbench-report: `mgbench report` as a binary without LibTorch (nor CUDA), for login nodes and
// laptops that only analyse results files. Same options as `mgbench report`, and --version.
#include <iostream>
#include <string_view>

#include "commands.h"
#include "core/build_info.h"

int main(int argc, char** argv) {
  if (argc == 2 && std::string_view(argv[1]) == "--version") {
    std::cout << "mgbench-report " << mgbench::build_info::kVersion << " (" << mgbench::build_info::kGitCommit << ", "
              << mgbench::build_info::kBuildType << ", " << mgbench::build_info::kCompiler << ")\n";
    return 0;
  }
  return mgbench::app::report_main(argc, argv);
}
