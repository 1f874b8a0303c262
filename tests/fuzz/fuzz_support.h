#pragma once
// What every fuzz target shares: the input written to a file (mgbench's parsers read files), and
// the rule every parser must keep -- malformed input ends in an mgbench::Error (a message naming
// the file), never a crash, another exception, a hang or an unbounded allocation (libFuzzer's
// -rss_limit_mb / -malloc_limit_mb and -timeout catch those).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/error.h"

namespace mgbench::fuzz {

/// This process's input file with the given name (the suffix picks a format), in $TMPDIR
/// (scripts/fuzz.sh gives each target its own and removes it).
inline std::string input_path(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp != nullptr ? tmp : "/tmp") + "/mgbench-fuzz-" + std::to_string(getpid()) + "-" + name;
}

/// Writes bytes to this process's input file with the given name; returns its path.
inline std::string write_input(const std::uint8_t* data, std::size_t size, const std::string& name) {
  const std::string path = input_path(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

/// Runs parse; an mgbench::Error is the expected answer to bad input. Anything else propagates
/// (libFuzzer reports the uncaught exception as a crash, with the input that caused it).
template <typename F>
void expect_clean_errors(F&& parse) {
  try {
    parse();
  } catch (const mgbench::Error&) {
  }
}

}  // namespace mgbench::fuzz
