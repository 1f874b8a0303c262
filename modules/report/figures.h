#pragma once
// `mgbench report --plot`: the figures are drawn by the Python analysis package (python/,
// mgbench_analysis: mgbench-plot), run as a child process.
#include <ostream>
#include <string>
#include <vector>

namespace mgbench::report {

/// Writes the figures and index.html of `files` into `directory` with mgbench-plot: the source tree's
/// package run by the configured Python where both exist (so the figures always match this build),
/// `mgbench-plot` from PATH otherwise. Returns 0, or 1 with a message on err saying how to install
/// the package.
int write_figures(const std::vector<std::string>& files, const std::string& directory, std::ostream& err);

}  // namespace mgbench::report
