#pragma once
// MPI started for an MPI command (`mgbench image`, `llm`, `comm`, `predict`).
#include <memory>
#include <string>

#include "runtime/mpi_env.h"

namespace mgbench::app {

/// The MPI environment (MPI_Init with thread support), or nullptr after printing "mgbench <command>:
/// <why>" when the MPI library cannot give it (every rank alike: exit 1, no collective).
std::unique_ptr<runtime::MpiEnvironment> start_mpi(const std::string& command, int& argc, char**& argv);

}  // namespace mgbench::app
