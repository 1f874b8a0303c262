#pragma once
// Where the tests find their inputs (the shared data, the oracle files) and what a test does when one
// is missing: it skips, and in CI (MGBENCH_CI=1) it fails naming the path. No LibTorch here: the
// runner's own status test (tests/unit/runner_status_cases.cpp) uses it too.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_paths.h"

namespace mgbench::test {

/// Directory of the files written by tests/python/make_oracles.py (env MGBENCH_ORACLE_DIR).
inline std::string oracle_dir() {
  const char* d = std::getenv("MGBENCH_ORACLE_DIR");
  return d != nullptr ? d : paths::default_oracle_dir();
}

/// The suite's input directory: env MGBENCH_SHARED_DATA (scripts/test.sh sets it to what
/// scripts/get-test-data.sh found), else CMake's MGBENCH_SHARED_DATA (default ../shared/data).
inline std::string shared_data_dir() {
  const char* d = std::getenv("MGBENCH_SHARED_DATA");
  return d != nullptr ? d : paths::default_shared_data();
}

/// True under CI (.ci/run sets MGBENCH_CI=1), where every input and tool of the suite is there: a test
/// that would skip for want of one fails instead (as tests/python/conftest.py does for the Python suites).
inline bool in_ci() {
  const char* v = std::getenv("MGBENCH_CI");
  return v != nullptr && std::string(v) == "1";
}

inline void append_paths(std::vector<std::string>& out, const std::string& path) { out.push_back(path); }
inline void append_paths(std::vector<std::string>& out, const std::vector<std::string>& paths) {
  out.insert(out.end(), paths.begin(), paths.end());
}

/// The paths and lists of paths `parts` as one list.
template <class... Parts>
std::vector<std::string> input_paths(const Parts&... parts) {
  std::vector<std::string> out;
  (append_paths(out, parts), ...);
  return out;
}

/// The inputs among `paths` that do not exist, as one sentence naming each and where it comes from;
/// "" when all exist. An input is a file or directory of the shared data (scripts/get-test-data.sh) or
/// an oracle file (tests/python/make_oracles.py).
inline std::string missing_inputs(const std::vector<std::string>& paths) {
  std::string missing;
  for (const std::string& p : paths) {
    if (!p.empty() && std::filesystem::exists(p)) continue;
    missing += (missing.empty() ? "" : ", ") + ("'" + p + "'");
  }
  if (missing.empty()) return missing;
  return "missing test input(s) " + missing + " (shared data: MGBENCH_SHARED_DATA='" + shared_data_dir() +
         "', scripts/get-test-data.sh; oracles: MGBENCH_ORACLE_DIR='" + oracle_dir() +
         "', the `oracles` test, tests/python/make_oracles.py)";
}

/// Skips the test for want of an input or tool (`what`: a streamable sentence naming it) -- and fails it
/// in CI (in_ci()). What no machine of CI's kind has (a GPU) is a plain GTEST_SKIP.
#define MGBENCH_SKIP_MISSING(what)                                                           \
  if (::mgbench::test::in_ci())                                                              \
    FAIL() << what << "; in CI (MGBENCH_CI=1) every input and tool of the suite is present"; \
  else                                                                                       \
    GTEST_SKIP() << what

/// Skips the test (fails it in CI) when any of its input paths (strings or vectors of them) is missing,
/// naming them.
#define MGBENCH_REQUIRE_INPUTS(...)                                                                                    \
  if (const std::string mgbench_missing_ = ::mgbench::test::missing_inputs(::mgbench::test::input_paths(__VA_ARGS__)); \
      mgbench_missing_.empty()) {                                                                                      \
  } else                                                                                                               \
    MGBENCH_SKIP_MISSING(mgbench_missing_)

}  // namespace mgbench::test
