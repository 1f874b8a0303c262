// gtest main for mgbench tests: initialises MPI (singleton or under mpirun); only rank 0 prints.
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
  mgbench::watchdog::stop();  // started by an MpiEnvironment a test made; before MPI_Finalize
  MPI_Finalize();
  return any_failed;
}
