#pragma once
// Results files named on a command line (`mgbench report`, `mgbench predict`).
#include <string>
#include <vector>

#include "results/reader.h"

namespace mgbench::app {

/// Files, directories (every *.h5 below, recursively) and quoted glob patterns -> the files,
/// sorted. Throws ResultsError for a pattern that matches nothing, a directory without results
/// files or one that cannot be read, naming it.
std::vector<std::string> expand_results_files(const std::vector<std::string>& args);

/// Every run of the files, in order (results::read_runs). Throws ResultsError naming the file.
std::vector<results::RunRecord> read_results_files(const std::vector<std::string>& files);

}  // namespace mgbench::app
