#pragma once
// A job that is aborted ends, even when a node is lost.
//
// A rank that ends the job calls MPI_Abort: Open MPI's launcher on its node (mpirun on the first
// node, its daemon orted on the others) kills the local ranks, tells every other daemon to do the
// same, and waits for all of them to answer. A daemon on a lost node never answers: behind a cut link
// the message is retransmitted until TCP gives up (~15 min with Linux's default tcp_retries2), and
// a hung node's kernel still acknowledges it, so Open MPI 4's mpirun waits forever; it has no
// time limit of its own for that wait. The allocation stays held and, under sbatch, the job reads
// RUNNING (measured on the simulated cluster, tests/cluster: mpirun alive 130 s after every rank had
// gone).
//
// The guard ends such a launcher: started by the aborting rank just before MPI_Abort, a small
// process (/bin/sh) in a session of its own -- the launcher's kill of the rank's process group spares
// it -- waits grace_s and, when the launcher is still the same process (its pid and start time), says
// so on stderr and sends it SIGKILL (not SIGTERM or SIGINT: Open MPI 4.1's mpirun, asked to end while
// a daemon is unreachable, crashes in PMIx_Finalize with a backtrace). A launcher that ended on its own
// within grace_s, as it does whenever every daemon answers, is left alone. Under srun the parent is
// slurmstepd and no guard is needed: MPI_Abort reaches srun through PMIx, which ends the step and
// gives up on an unreachable node after SLURM's KillWait.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mgbench::launcher_guard {

/// How long a guard lets the launcher end the job on its own [s]: Open MPI ends an aborted job in
/// about a second when every daemon answers.
inline constexpr double kGraceS = 15.0;

/// What /proc/<pid>/stat says of a process (proc(5)).
struct ProcStat {
  std::string comm;               // field 2, the executable's name (up to 15 characters)
  int ppid = 0;                   // field 4
  std::uint64_t start_ticks = 0;  // field 22: start time after boot [clock ticks]
};

/// Parses one /proc/<pid>/stat line; nullopt when it is not one. The name may hold spaces and
/// parentheses: it ends at the line's last ')'.
std::optional<ProcStat> parse_proc_stat(std::string_view line);

/// Reads /proc/<pid>/stat; nullopt when the process does not exist (or the line does not parse).
std::optional<ProcStat> read_proc_stat(int pid);

/// A launcher process, identified across pid reuse by its start time.
struct Launcher {
  int pid = 0;
  std::string name;
  std::uint64_t start_ticks = 0;
};

/// Whether an executable name is one of Open MPI's launchers: mpirun / mpiexec / orterun (the
/// first node's), orted (the others'), and PRRTE's prterun / prte / prted (Open MPI 5).
bool is_open_mpi_launcher(std::string_view comm);

/// This process's parent when it is an Open MPI launcher, else nullopt (srun's slurmstepd, a shell,
/// a test runner). Call at start-up: a parent that dies first leaves the process re-parented.
std::optional<Launcher> find_launcher();

/// Starts the guard of `launcher` (above), naming this rank in its message; its pid, or -1 when it
/// could not be started (logged). Never throws: the caller is ending the job.
int arm(const Launcher& launcher, double grace_s, int rank) noexcept;

}  // namespace mgbench::launcher_guard
