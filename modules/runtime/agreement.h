#pragma once
// Stages every rank runs and all agree on: a stage that throws on one rank fails on every rank,
// cleanly, instead of leaving the others waiting in a collective (docs/design.md, "lifecycle").
#include <functional>
#include <string_view>

#include "runtime/mpi_env.h"

namespace mgbench::runtime {

/// Runs step on every rank; true when it succeeded everywhere. Otherwise the lowest failing rank
/// logs its error as "<stage> failed [on rank r]: <what>" and every rank returns false (no hang,
/// no abort). Collective (one MPI_Allreduce).
bool all_succeed(const MpiEnvironment& env, std::string_view stage, const std::function<void()>& step);

}  // namespace mgbench::runtime
