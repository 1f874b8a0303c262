// runtime/stop_request: the stop signals reach the handler whatever mask the launcher left.
#include <gtest/gtest.h>
#include <pthread.h>

#include <csignal>

#include "runtime/stop_request.h"

namespace mgbench {
namespace {

/// In a child process (a death test): SIGUSR1 blocked as a launcher might leave it, the handlers
/// installed, the signal raised; the child exits with the signal it recorded (0: none arrived).
[[noreturn]] void raise_while_started_blocked(int signal_number) {
  sigset_t blocked;
  sigemptyset(&blocked);
  sigaddset(&blocked, signal_number);
  pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
  runtime::install_stop_handlers();
  runtime::defer_stops_to_step_boundaries();  // recorded, not the set-up's immediate exit
  std::raise(signal_number);
  std::_Exit(runtime::stop_signal_received());
}

TEST(StopRequest, SignalsBlockedByTheLauncherStillReachTheHandler) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(raise_while_started_blocked(SIGUSR1), testing::ExitedWithCode(SIGUSR1), "");
  EXPECT_EXIT(raise_while_started_blocked(SIGTERM), testing::ExitedWithCode(SIGTERM), "");
}

}  // namespace
}  // namespace mgbench
