#pragma once
// The job's set-up and checkpoint stages, agreed over all ranks (core/agreement.h) and logged.
#include <functional>
#include <string_view>

#include "runtime/mpi_env.h"

namespace mgbench::runtime {

/// Runs step on every rank; true when it succeeded everywhere. Otherwise the lowest failing rank
/// logs its error as "<stage> failed [on rank r]: <what>" (unless it said so while waiting; see
/// mgbench::agree) and every rank returns false (no hang, no abort). Collective over env.world().
bool all_succeed(const MpiEnvironment& env, std::string_view stage, const std::function<void()>& step);

}  // namespace mgbench::runtime
