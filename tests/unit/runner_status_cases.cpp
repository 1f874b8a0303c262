// Cases for the test `runner_exit_status` (tests/CMakeLists.txt), which checks test_main.cpp's exit
// status: 77 where every test skipped, 1 where one failed beside a skipped one (never "skipped"),
// 1 and promptly where under several ranks one rank failed before a collective the others wait in.
#include <mpi.h>

#include <cstdlib>
#include <stdexcept>

#include <gtest/gtest.h>

#include "test_inputs.h"

namespace {

TEST(RunnerStatus, Skips) { GTEST_SKIP() << "skipped on purpose"; }

TEST(RunnerStatus, FailsWhenAsked) {
  if (std::getenv("MGBENCH_RUNNER_STATUS_FAIL") == nullptr) GTEST_SKIP() << "MGBENCH_RUNNER_STATUS_FAIL not set";
  ADD_FAILURE() << "failed on purpose";
}

// A test input that is not there: skipped, and failed in CI (MGBENCH_CI=1).
TEST(RunnerStatus, MissingInput) {
  if (std::getenv("MGBENCH_RUNNER_STATUS_MISSING") == nullptr) GTEST_SKIP() << "MGBENCH_RUNNER_STATUS_MISSING not set";
  MGBENCH_REQUIRE_INPUTS("/nonexistent/mgbench-runner-status-input");
}

// Rank 0 throws before the barrier rank 1 waits in (as a rank-0-only section of a GPU test did on an
// H200): the job must end with status 1, not wait for ctest's timeout.
TEST(RunnerStatus, OneRankFailsBeforeACollective) {
  if (std::getenv("MGBENCH_RUNNER_STATUS_COLLECTIVE") == nullptr)
    GTEST_SKIP() << "MGBENCH_RUNNER_STATUS_COLLECTIVE not set";
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) throw std::runtime_error("rank 0 failed on purpose");
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
