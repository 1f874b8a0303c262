#pragma once
// Logging: spdlog with the rank in every line. Rank 0 logs at info; other ranks only warn and
// above, so a job's output stays readable while a misbehaving rank still speaks up.
#include <spdlog/spdlog.h>

namespace mgbench::log {

/// Configures the process-wide logger for this rank. verbose: also info on ranks > 0 and debug.
void init(int rank, int world_size, bool verbose = false);

using spdlog::debug;
using spdlog::error;
using spdlog::info;
using spdlog::warn;

}  // namespace mgbench::log
