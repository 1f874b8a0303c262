// Results files named on a command line: files, directories (every *.h5 below) and quoted glob
// patterns, as `mgbench report` and `mgbench predict` take them.
#include "results/files.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <set>

#include <fmt/format.h>

#include "core/error.h"

namespace mgbench::results {

std::vector<std::string> expand_results_files(const std::vector<std::string>& args) {
  std::vector<std::string> files;
  for (const auto& f : args) {
    if (!std::filesystem::exists(f) && f.find_first_of("*?[") != std::string::npos) {
      // A pattern the shell did not expand (quoted, or too many files for one command line).
      glob_t matches{};
      const int rc = glob(f.c_str(), 0, nullptr, &matches);
      if (rc != 0) {
        globfree(&matches);
        throw ResultsError(fmt::format("no file matches '{}'", f));
      }
      for (std::size_t i = 0; i < matches.gl_pathc; ++i) files.emplace_back(matches.gl_pathv[i]);
      globfree(&matches);
    } else if (std::filesystem::is_directory(f)) {
      // Walked with error codes: an unreadable subdirectory is named, not thrown through main.
      std::error_code ec;
      std::size_t found = 0;
      std::string last = f;
      for (std::filesystem::recursive_directory_iterator it(f, ec), end; !ec && it != end; it.increment(ec)) {
        last = it->path().string();
        if (it->path().extension() == ".h5") {
          files.push_back(last);
          ++found;
        }
      }
      if (ec) throw ResultsError(fmt::format("cannot read below '{}' (at '{}'): {}", f, last, ec.message()));
      if (found == 0) throw ResultsError(fmt::format("no results file (*.h5) below '{}'", f));  // as a pattern
    } else {
      files.push_back(f);
    }
  }
  std::sort(files.begin(), files.end());
  // Each file once however it was named (a directory and a file in it, ./a.h5 and a.h5): its runs
  // read twice were two repeats of one run.
  std::set<std::filesystem::path> seen;
  std::vector<std::string> unique;
  for (auto& f : files) {
    std::error_code ec;
    std::filesystem::path key = std::filesystem::weakly_canonical(f, ec);
    if (ec) key = f;
    if (seen.insert(key).second) unique.push_back(std::move(f));
  }
  return unique;
}

std::vector<RunRecord> read_results_files(const std::vector<std::string>& files) {
  std::vector<RunRecord> runs;
  for (const auto& f : files) {
    auto more = read_runs(f);
    runs.insert(runs.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  }
  return runs;
}

}  // namespace mgbench::results
