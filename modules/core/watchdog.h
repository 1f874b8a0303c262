#pragma once
// Deadlines on the blocking parts of a job, and a census of the ranks when one passes.
//
// A rank that dies takes the job down within seconds (the launcher sees it), but a rank that is
// stopped (SIGSTOP, a debugger, a hung node or file system) or stuck in another call leaves its
// peers waiting in a collective forever: MPI has no timeouts. Every blocking stage of mgbench that
// waits on other ranks -- an MPI collective of the communicator, an agreement between set-up
// stages, the stop agreement at a step boundary, a collective HDF5 call -- runs under a Deadline.
// One thread per process (started by MpiEnvironment) watches them: when one passes, it asks every
// other rank where it is (point-to-point on MPI_COMM_WORLD, answered by their watchdog threads,
// which is why a rank busy computing or blocked outside MPI still answers), logs the stage, the
// time and each rank's answer -- a rank that does not answer within kCensusWindowS is named as
// stopped or hung -- and ends the job (MPI_Abort, exit 1). As PyTorch's NCCL watchdog with
// TORCH_NCCL_DESYNC_DEBUG, for every blocking stage and both backends.
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>

namespace mgbench::watchdog {

/// How long a census waits for the other ranks' answers [s].
inline constexpr double kCensusWindowS = 3.0;

/// Starts this process's watchdog thread (idempotent). MPI must be initialised with
/// MPI_THREAD_MULTIPLE. Without it, Deadlines are labels only: nothing expires.
void start();
/// Stops the thread (idempotent); call before MPI_Finalize.
void stop();
/// The timeout of Deadlines that name none [s]; 0 (the initial value): none. The jobs set it from
/// --comm-timeout once their options are parsed.
void set_default_timeout(double seconds);
double default_timeout();

/// While alive, this thread of this rank is in stage `what` (a census names it). When timeout_s
/// passes first, the watchdog runs on_expiry (on its own thread: e.g. removing a file this job
/// created and left half-made), then the census, and aborts the job with
///   "rank r: <what> did not finish in N s; <census>; aborting the job (--comm-timeout)".
/// timeout_s < 0: the default timeout; 0: none (a label for the census only).
class Deadline {
 public:
  explicit Deadline(std::string what, double timeout_s = -1, std::function<void()> on_expiry = {});
  ~Deadline();
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

 private:
  std::uint64_t id_ = 0;
};

/// What records an expiry where the run's results say it (the results writer: the run's status
/// "aborted" and the message), called on the watchdog's thread before MPI_Abort with
/// "<what> did not complete in N s ...; the ranks: <census>". Up to kRecordWindowS is given to it.
/// Set by the results writer once its run exists, cleared (an empty function) when it closes.
using AbortRecorder = std::function<void(const std::string& message)>;
void set_abort_recorder(AbortRecorder recorder);

/// How long an expiry waits for its recorder, and then for MPI_Abort to end the process, before the
/// process ends itself (exit 1): MPI_Abort cannot return while the launcher's daemon is unreachable
/// (a cut link, a lost node), and the rank must go all the same [s].
inline constexpr double kRecordWindowS = 5.0;
inline constexpr double kAbortWindowS = 10.0;

/// Ends the whole job from this rank, as every abort of mgbench does (a watchdog expiry, a failing
/// rank, NCCL's error): stdout / stderr flushed, the launcher guard armed when an Open MPI launcher
/// started this rank (core/launcher_guard.h: the job ends even when a lost node's daemon never
/// answers), then MPI_Abort(exit_code); the process ends itself after kAbortWindowS if MPI_Abort has
/// not. Record the cause first: nothing is written here. Any thread.
[[noreturn]] void abort_job(int exit_code);

/// Asks every other rank where it is and waits up to window_s for the answers, answering other
/// ranks' requests meanwhile. "rank 1: no answer in 3 s (stopped, or hung outside mgbench); rank 2:
/// in MPI_Iallreduce #57 for 12 s". Any thread; "" on one rank.
std::string census(double window_s = kCensusWindowS);

}  // namespace mgbench::watchdog
