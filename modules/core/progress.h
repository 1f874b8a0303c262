#pragma once
// Training progress for people: a live bar on a terminal, periodic plain lines otherwise
// (batch logs, `srun` output files). Only the rank that owns a Progress prints.
#include <cstdint>
#include <cstdio>
#include <string>

namespace mgbench {

struct ProgressState {
  int epoch = 0;  // 1-based
  int epochs = 0;
  std::int64_t step = 0;   // 1-based, within the epoch
  std::int64_t steps = 0;  // steps in the epoch
  double loss = 0.0;
  double samples_per_s = 0.0;  // img/s or tokens/s, this rank
  double elapsed_s = 0.0;      // since the start of the run
  double eta_s = 0.0;          // estimated time to the end of the run
};

class Progress {
 public:
  /// enabled: print at all (rank 0); interval_s: seconds between plain lines when not a terminal.
  /// unit: label of samples_per_s, e.g. "img/s".
  Progress(bool enabled, std::string unit, double interval_s = 10.0, std::FILE* out = stderr);
  /// Called every step; throttled internally (bar: ~10 Hz, plain lines: every interval_s).
  void update(const ProgressState& s);
  /// Ends the live line (if any) and prints a message line.
  void message(const std::string& line);

 private:
  void draw(const ProgressState& s);
  bool enabled_;
  bool live_;
  std::string unit_;
  double interval_s_;
  std::FILE* out_;
  double last_draw_s_ = -1e30;
  bool line_open_ = false;
};

/// Formats seconds as H:MM:SS.
std::string format_duration(double seconds);

}  // namespace mgbench
