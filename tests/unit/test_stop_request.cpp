// runtime/stop_request: the stop signals reach the handler whatever mask the launcher left; the same
// request delivered along several paths is one request, a repeat later on forces the stop.
#include <gtest/gtest.h>
#include <pthread.h>

#include <chrono>
#include <csignal>
#include <thread>

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

/// In a child process: the handlers installed past the set-up, `signal_number` raised three times at
/// once (SLURM's time limit signals the task, srun forwards its own, the batch script forwards its
/// own), then once more after `later_s`; the child exits with the signal it recorded.
[[noreturn]] void raise_thrice_then_again(int signal_number, double later_s) {
  runtime::install_stop_handlers();
  runtime::defer_stops_to_step_boundaries();
  for (int i = 0; i < 3; ++i) std::raise(signal_number);
  std::this_thread::sleep_for(std::chrono::duration<double>(later_s));
  std::raise(signal_number);
  std::_Exit(runtime::stop_signal_received());
}

TEST(StopRequest, TheSameSignalAtOnceIsOneRequestAndALaterRepeatForcesTheStop) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Within the window: one request, recorded, the process goes on to its step boundary.
  EXPECT_EXIT(raise_thrice_then_again(SIGTERM, 0.1), testing::ExitedWithCode(SIGTERM), "");
  // Asked again after it: the default action, as an operator who insists means.
  EXPECT_EXIT(raise_thrice_then_again(SIGTERM, runtime::kRepeatIsTheSameRequestS + 0.2),
              testing::KilledBySignal(SIGTERM), "");
  EXPECT_EXIT(raise_thrice_then_again(SIGUSR1, 0.1), testing::ExitedWithCode(SIGUSR1), "");
}

}  // namespace
}  // namespace mgbench
