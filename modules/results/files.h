#pragma once
// Results files named on a command line (`mgbench report`, `mgbench predict`): files, directories
// and quoted glob patterns.
#include <string>
#include <vector>

#include "results/reader.h"

namespace mgbench::results {

/// Files, directories (every *.h5 below, recursively) and quoted glob patterns -> the files,
/// sorted, each once (by its canonical path). Throws ResultsError for a pattern that matches nothing, a directory
/// without results files or one that cannot be read, naming it.
std::vector<std::string> expand_results_files(const std::vector<std::string>& args);

/// Every run of the files, in order (read_runs). Throws ResultsError naming the file.
std::vector<RunRecord> read_results_files(const std::vector<std::string>& files);

}  // namespace mgbench::results
