#include "train/checkpoint/checkpoint_options.h"

#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace mgbench::train {

void CheckpointOptions::declare(options::OptionTable& t) {
  t.section("Checkpoints and preemption (SIGTERM / SIGUSR1: stop at the next step, checkpoint, exit 75)");
  t.add("checkpoint-dir", dir,
        "directory of checkpoints (one subdirectory per run configuration); "
        "empty: none")
      .no_effect();
  t.add("checkpoint-every", every_steps,
        "optimizer steps between checkpoints (0: only when stopped by a signal and at the end)")
      .at_least(0)
      .no_effect();
  t.add("resume", resume,
        "continue the latest checkpoint of this configuration in --checkpoint-dir (its run, its results file); "
        "a new run when the directory holds no checkpoint of this task; refused, listing the settings that "
        "differ, when it holds another configuration's")
      .as_switch()
      .no_effect();
}

void CheckpointOptions::validate() const {
  MGBENCH_REQUIRE(!dir.empty() || (every_steps == 0 && !resume), ConfigError,
                  "--checkpoint-every and --resume need --checkpoint-dir (where the checkpoints are)");
  std::error_code ec;
  MGBENCH_REQUIRE(dir.empty() || !std::filesystem::exists(dir, ec) || std::filesystem::is_directory(dir, ec),
                  ConfigError, "--checkpoint-dir '{}': a file, expected a directory (or a path to create one at)", dir);
}

}  // namespace mgbench::train
