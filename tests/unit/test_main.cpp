// gtest main for mgbench tests: initialises MPI (singleton or under mpirun); only rank 0 prints.
// Exit status: 1 where a test failed on any rank; 77 (ctest's SKIP_RETURN_CODE) where every test
// that ran was skipped on every rank; else 0. (Not a SKIP_REGULAR_EXPRESSION: with one, ctest
// reports a run whose output names a skipped test as skipped even when another test failed.)
// Under several ranks a failed test ends the job (MPI_Abort): an assertion or an exception may
// have skipped a collective the other ranks wait in (seen on an H200: a rank-0-only section threw,
// skipped the test's MPI_Barrier, and the job hung until ctest's timeout).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <signal.h>
#include <ucontext.h>

#include <cstdio>

#include "core/watchdog.h"

namespace {

int world_rank = 0;
int world_size = 1;

/// Prints rank > 0's failures (only rank 0 has gtest's printer) and ends the job on a failed test.
class EndTheJobOnFailure : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (world_rank != 0 && result.failed()) {
      std::fprintf(stderr, "rank %d: %s:%d: Failure\n%s\n", world_rank, result.file_name() ? result.file_name() : "?",
                   result.line_number(), result.message());
    }
  }
  void OnTestEnd(const ::testing::TestInfo& test) override {
    if (world_size > 1 && test.result()->Failed()) {
      std::fprintf(stderr, "rank %d: %s.%s failed: MPI_Abort, so that no rank waits in a collective this one skipped\n",
                   world_rank, test.test_suite_name(), test.name());
      std::fflush(nullptr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
};

#if defined(__x86_64__)
/// A call through a null function pointer leaves no frame to unwind from (Open MPI's handler then
/// prints libc's frame only): name the caller from the return address the call pushed.
void name_null_call_site(int sig, siginfo_t* /*info*/, void* context) {
  const auto& registers = static_cast<const ucontext_t*>(context)->uc_mcontext.gregs;
  if (registers[REG_RIP] == 0) {
    void* const caller = *reinterpret_cast<void* const*>(registers[REG_RSP]);
    Dl_info where{};
    if (dladdr(caller, &where) != 0) {
      std::fprintf(stderr, "rank %d: signal %d: a call through a null pointer from %s+%#tx (%s+%#tx)\n", world_rank,
                   sig, where.dli_sname ? where.dli_sname : "?",
                   static_cast<const char*>(caller) - static_cast<const char*>(where.dli_saddr), where.dli_fname,
                   static_cast<const char*>(caller) - static_cast<const char*>(where.dli_fbase));
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
#if defined(__x86_64__)
  struct sigaction action {};
  action.sa_sigaction = name_null_call_site;
  action.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &action, nullptr);  // after MPI_Init, which installs its own
#endif
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (world_rank != 0) delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new EndTheJobOnFailure);
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
