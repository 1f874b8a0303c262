// Cases for the test `runner_exit_status` (tests/CMakeLists.txt), which checks test_main.cpp's exit
// status: 77 where every test skipped, 1 where one failed beside a skipped one (never "skipped").
#include <cstdlib>

#include <gtest/gtest.h>

namespace {

TEST(RunnerStatus, Skips) { GTEST_SKIP() << "skipped on purpose"; }

TEST(RunnerStatus, FailsWhenAsked) {
  if (std::getenv("MGBENCH_RUNNER_STATUS_FAIL") == nullptr) GTEST_SKIP() << "MGBENCH_RUNNER_STATUS_FAIL not set";
  ADD_FAILURE() << "failed on purpose";
}

}  // namespace
