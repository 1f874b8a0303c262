// gtest main for mgbench tests: initialises MPI (singleton or under mpirun); only rank 0 prints.
// Exit status: 1 where a test failed on any rank; 77 (ctest's SKIP_RETURN_CODE) where every test
// that ran was skipped on every rank; else 0. (Not a SKIP_REGULAR_EXPRESSION: with one, ctest
// reports a run whose output names a skipped test as skipped even when another test failed.)
#include <gtest/gtest.h>
#include <mpi.h>

#include "core/watchdog.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const auto& run = *::testing::UnitTest::GetInstance();
  int all_skipped = run.skipped_test_count() > 0 && run.successful_test_count() == 0 && run.failed_test_count() == 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_skipped, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  mgbench::watchdog::stop();  // started by an MpiEnvironment a test made; before MPI_Finalize
  MPI_Finalize();
  constexpr int kAllSkipped = 77;
  return any_failed != 0 ? 1 : all_skipped != 0 ? kAllSkipped : 0;
}
