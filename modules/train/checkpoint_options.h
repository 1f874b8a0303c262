#pragma once
// The checkpoint options every job has (--checkpoint-dir, --checkpoint-every, --resume); the
// checkpoints themselves: checkpoint.h. No torch or MPI here.
#include <cstdint>
#include <string>

namespace mgbench::train {

struct CheckpointOptions {
  std::string dir;  // --checkpoint-dir; empty: no checkpoints
  std::int64_t every_steps =
      0;                // --checkpoint-every: optimizer steps between checkpoints (0: only at a stop and the end)
  bool resume = false;  // --resume: continue the latest checkpoint of the same configuration

  /// Throws ConfigError naming the option: a negative interval, or --checkpoint-every / --resume
  /// without --checkpoint-dir.
  void validate() const;
};

}  // namespace mgbench::train
