#pragma once
// The profile window: the part of a run whose CUDA activity CUPTI collects. The paper profiled
// the first 720 s of each run with Nsight Systems; `--profile-window 0:720` does the same.
#include <cstdint>
#include <string>

namespace mgbench::profile {

struct ProfileWindow {
  bool by_steps = false;  // true: [first_step, first_step + steps); false: seconds since the run started
  double start_s = 0;
  double duration_s = 0;  // <= 0: to the end of the run
  std::int64_t first_step = 0;
  std::int64_t steps = 0;  // <= 0: to the end of the run

  /// Whether a step that begins at `elapsed_s` seconds into the run, with global index `step`
  /// (0-based over the run), lies in the window.
  bool contains(double elapsed_s, std::int64_t step) const;
  /// "0:720 s", "steps 100-199", "whole run".
  std::string describe() const;
};

/// Parses "START:DURATION" (seconds; "0:720"; DURATION 0 or empty = to the end), "steps:FIRST:COUNT"
/// (global step indices), "all" or "" (the whole run). Throws ConfigError naming --profile-window.
ProfileWindow parse_profile_window(const std::string& text);

}  // namespace mgbench::profile
