#pragma once
// String collectives shared by the results writer and the runtime (no LibTorch).
#include <mpi.h>

#include <string>
#include <vector>

namespace mgbench {

// Both run under a watchdog::Deadline (the default timeout): a rank that never arrives ends the job.

/// Rank 0's value on every rank. Collective over comm; throws CommError on failure.
std::string broadcast_string(MPI_Comm comm, std::string value);

/// Every rank's string, in rank order. Collective over comm; throws CommError on failure.
std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine);

}  // namespace mgbench
