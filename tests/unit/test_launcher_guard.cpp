// The launcher guard (core/launcher_guard.h): the stat-line parser against proc(5)'s layout, and
// the guard process itself against real processes -- it kills the launcher it names once the grace
// passed, leaves alone one that ended or whose pid now belongs to another process, and survives the
// kill of the aborting rank's process group (its own session).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "core/launcher_guard.h"

namespace mgbench {
namespace {

using namespace launcher_guard;

/// A child process that sleeps (a stand-in launcher); its pid.
pid_t sleeper() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sleep", "sleep", "60", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

/// Waits up to timeout_s for the child to end; its wait status, or -1 while it still runs.
int wait_s(pid_t pid, double timeout_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (std::chrono::steady_clock::now() < until) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

TEST(LauncherGuard, ParsesTheFieldsOfAStatLineWhateverTheName) {
  // proc(5): pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime
  // stime cutime cstime priority nice num_threads itrealvalue starttime vsize ...
  const auto s = parse_proc_stat(
      "4242 (mpi run) (x)) S 17 4242 4242 0 -1 4194560 900 0 0 0 5 3 0 0 20 0 4 0 987654321 123456 789 "
      "18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 17 1 0 0 0 0 0");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->comm, "mpi run) (x)");
  EXPECT_EQ(s->ppid, 17);
  EXPECT_EQ(s->start_ticks, 987654321U);
  EXPECT_FALSE(parse_proc_stat("4242 (cut) S 17 4242").has_value());
  EXPECT_FALSE(parse_proc_stat("no parentheses here").has_value());
  EXPECT_FALSE(parse_proc_stat("1 (x) S notanumber 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0").has_value());
}

TEST(LauncherGuard, ReadsThisProcessAndKnowsOpenMpisLaunchers) {
  const auto self = read_proc_stat(static_cast<int>(::getpid()));
  ASSERT_TRUE(self.has_value());
  EXPECT_EQ(self->ppid, static_cast<int>(::getppid()));
  EXPECT_GT(self->start_ticks, 0U);
  for (const char* name : {"mpirun", "mpiexec", "orterun", "orted", "prterun", "prted"}) {
    EXPECT_TRUE(is_open_mpi_launcher(name)) << name;
  }
  for (const char* name : {"slurmstepd", "srun", "bash", "ctest", "mpirun.sh"}) {
    EXPECT_FALSE(is_open_mpi_launcher(name)) << name;
  }
  EXPECT_FALSE(read_proc_stat(-1).has_value());
}

TEST(LauncherGuard, KillsTheLauncherThatOutlivesTheGrace) {
  const pid_t launcher = sleeper();
  const auto stat = read_proc_stat(launcher);
  ASSERT_TRUE(stat.has_value());
  const int guard = arm({launcher, "sleep", stat->start_ticks}, 0.3, 7);
  ASSERT_GT(guard, 0);
  EXPECT_EQ(::getsid(guard), guard) << "the guard leads a session of its own";
  const int status = wait_s(launcher, 10);
  ASSERT_NE(status, -1) << "the launcher still runs 10 s after a 0.3 s grace";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_NE(wait_s(guard, 10), -1);
}

TEST(LauncherGuard, LeavesAloneAProcessThatIsNotTheLauncherItWasArmedFor) {
  const pid_t other = sleeper();
  const auto stat = read_proc_stat(other);
  ASSERT_TRUE(stat.has_value());
  // The same pid with another start time: the launcher ended and the pid was reused.
  const int guard = arm({other, "sleep", stat->start_ticks + 1}, 0.2, 0);
  ASSERT_GT(guard, 0);
  const int guard_status = wait_s(guard, 10);
  ASSERT_NE(guard_status, -1);
  EXPECT_TRUE(WIFEXITED(guard_status) && WEXITSTATUS(guard_status) == 0) << guard_status;
  EXPECT_EQ(wait_s(other, 0.5), -1) << "a process that is not the launcher was killed";
  ::kill(other, SIGKILL);
  wait_s(other, 10);
}

TEST(LauncherGuard, OutlivesTheKillOfTheAbortingRanksProcessGroup) {
  // A rank in a process group of its own arms the guard and is killed with its group, as Open MPI's
  // daemon kills a rank; the guard still ends the launcher.
  const pid_t launcher = sleeper();
  const auto stat = read_proc_stat(launcher);
  ASSERT_TRUE(stat.has_value());
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t rank = ::fork();
  if (rank == 0) {
    ::setpgid(0, 0);
    const int guard = arm({launcher, "sleep", stat->start_ticks}, 1.0, 3);
    (void)!::write(pipe_fds[1], &guard, sizeof guard);
    ::pause();
    ::_exit(0);
  }
  int guard = -1;
  ASSERT_EQ(::read(pipe_fds[0], &guard, sizeof guard), static_cast<ssize_t>(sizeof guard));
  ASSERT_GT(guard, 0);
  ::kill(-rank, SIGKILL);
  EXPECT_NE(wait_s(rank, 10), -1);
  const int status = wait_s(launcher, 10);
  ASSERT_NE(status, -1) << "the guard died with the rank's process group";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

}  // namespace
}  // namespace mgbench
