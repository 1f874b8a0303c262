#include "core/launcher_guard.h"

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <array>
#include <charconv>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "core/log.h"

extern char** environ;

namespace mgbench::launcher_guard {
namespace {

/// The guard: sh -c SCRIPT guard GRACE PID START MESSAGE. Field 22 of the stat line is the 20th
/// after the name's closing parenthesis.
constexpr const char* kScript =
    "trap '' PIPE HUP INT TERM\n"
    "sleep \"$1\"\n"
    "stat=$(cat \"/proc/$2/stat\" 2>/dev/null) || exit 0\n"
    "set -- \"$2\" \"$3\" \"$4\" ${stat##*) }\n"
    "pid=$1 start=$2 message=$3\n"
    "shift 22\n"
    "[ \"$1\" = \"$start\" ] || exit 0\n"
    "echo \"$message\" >&2\n"
    "sleep 1\n"  // the launcher forwards the rank's stderr, this message included: let it
    "kill -KILL \"$pid\" 2>/dev/null\n"
    "exit 0\n";

}  // namespace

std::optional<ProcStat> parse_proc_stat(std::string_view line) {
  const std::size_t open = line.find('(');
  const std::size_t close = line.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) return std::nullopt;
  ProcStat stat;
  stat.comm = std::string(line.substr(open + 1, close - open - 1));
  // Fields 3.. after the name: state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt
  // cmajflt utime stime cutime cstime priority nice num_threads itrealvalue starttime ...
  std::istringstream rest{std::string(line.substr(close + 1))};
  std::vector<std::string> fields;
  for (std::string f; fields.size() < 20 && rest >> f;) fields.push_back(f);
  if (fields.size() < 20) return std::nullopt;
  const auto number = [](const std::string& text, auto& out) {
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
    return ec == std::errc{} && end == text.data() + text.size();
  };
  if (!number(fields[1], stat.ppid) || !number(fields[19], stat.start_ticks)) return std::nullopt;
  return stat;
}

std::optional<ProcStat> read_proc_stat(int pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return parse_proc_stat(line);
}

bool is_open_mpi_launcher(std::string_view comm) {
  for (std::string_view name : {"mpirun", "mpiexec", "orterun", "orted", "prterun", "prte", "prted"}) {
    if (comm == name) return true;
  }
  return false;
}

std::optional<Launcher> find_launcher() {
  const int parent = static_cast<int>(::getppid());
  const auto stat = read_proc_stat(parent);
  if (!stat || !is_open_mpi_launcher(stat->comm)) return std::nullopt;
  return Launcher{parent, stat->comm, stat->start_ticks};
}

int arm(const Launcher& launcher, double grace_s, int rank) noexcept {
  try {
    const std::string grace = fmt::format("{:.1f}", grace_s);
    const std::string pid = std::to_string(launcher.pid);
    const std::string start = std::to_string(launcher.start_ticks);
    const std::string message = fmt::format(
        "mgbench: {} (pid {}) still runs {:.0f} s after rank {} aborted the job: a node it waits for is lost "
        "or hung; ending it (SIGKILL)",
        launcher.name, launcher.pid, grace_s, rank);
    std::array<char*, 9> argv{const_cast<char*>("sh"),
                              const_cast<char*>("-c"),
                              const_cast<char*>(kScript),
                              const_cast<char*>("mgbench-launcher-guard"),
                              const_cast<char*>(grace.c_str()),
                              const_cast<char*>(pid.c_str()),
                              const_cast<char*>(start.c_str()),
                              const_cast<char*>(message.c_str()),
                              nullptr};
    posix_spawnattr_t attr;
    posix_spawn_file_actions_t files;
    posix_spawnattr_init(&attr);
    posix_spawn_file_actions_init(&files);
    // Its own session: not in the process group the launcher kills, nor reached by a terminal's signals.
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
    posix_spawn_file_actions_addopen(&files, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    pid_t guard = -1;
    const int rc = posix_spawn(&guard, "/bin/sh", &files, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&files);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
      log::error("rank {}: could not start the guard of {} (pid {}): error {}", rank, launcher.name, launcher.pid, rc);
      return -1;
    }
    return static_cast<int>(guard);
  } catch (...) {
    return -1;
  }
}

}  // namespace mgbench::launcher_guard
