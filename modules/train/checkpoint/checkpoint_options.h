#pragma once
// The checkpoint options of a training job (--checkpoint-dir, --checkpoint-every, --resume):
// declared by the checkpointer's library, part of the training loop's options (TrainOptions). No
// torch or MPI.
#include <cstdint>
#include <string>

#include "core/option_table.h"

namespace mgbench::train {

struct CheckpointOptions {
  std::string dir;               // empty: no checkpoints
  std::int64_t every_steps = 0;  // optimizer steps between checkpoints (0: only at a stop and the end)
  bool resume = false;           // continue the latest checkpoint of the same configuration

  /// Declares the three options (section "Checkpoints and preemption"); none changes results.
  void declare(options::OptionTable& table);
  /// Throws ConfigError naming the option: --checkpoint-every / --resume without --checkpoint-dir, a
  /// --checkpoint-dir that is a file.
  void validate() const;
};

}  // namespace mgbench::train
