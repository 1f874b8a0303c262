#pragma once
// Stages every rank runs and all agree on: a stage that throws on one rank fails on every rank,
// cleanly, instead of leaving the others waiting in a collective (docs/design.md, "lifecycle").
// The one implementation behind runtime::all_succeed (set-up and checkpoint stages) and the results
// writer's collective HDF5 stages. No LibTorch.
#include <mpi.h>

#include <functional>
#include <string>
#include <string_view>

namespace mgbench {

/// How a stage ended, the same on every rank.
struct Agreement {
  int failed_rank = -1;   // the lowest rank on which the stage threw; -1: it succeeded everywhere
  std::string error;      // that rank's exception message, on every rank ("" when none failed)
  bool reported = false;  // this rank has already logged its own error (see agree)
  bool ok() const { return failed_rank < 0; }
};

/// Runs `step` on every rank of `comm` and agrees on the outcome: one MPI_Iallreduce of the lowest
/// failing rank under a watchdog::Deadline named after `stage`, then, only on failure, one string
/// allgather for that rank's message. A rank whose step threw and whose peers have not arrived after
/// 2 s (or half the watchdog's default timeout, if shorter) logs "<stage> failed on rank r (waiting
/// for the other ranks): <error>" at once and sets `reported`: a peer stuck inside the stage (a
/// collective HDF5 call this rank left) ends the job through the watchdog, and this line is then
/// the only reason given. Collective over comm. Throws CommError only where MPI itself fails.
Agreement agree(MPI_Comm comm, std::string_view stage, const std::function<void()>& step);

}  // namespace mgbench
