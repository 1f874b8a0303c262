#pragma once
// Preemption: a rank asked to stop (SIGTERM from SLURM's time limit or scancel, SIGUSR1 from
// `#SBATCH --signal=B:USR1@120` forwarded by the batch script, or from `mpirun` which forwards
// SIGUSR1/SIGUSR2) finishes its current step, and every rank of the job stops at the same step
// boundary, so the checkpoint written there is consistent across ranks.
//
// The agreement costs no stall: at step boundary k each rank starts a non-blocking MAX reduction
// of "a signal arrived here" on a communicator of its own (MPI_Iallreduce) and completes the one
// started at boundary k-1, which has long finished. Every rank thus learns the same answer at the
// same boundary, one step after the first rank saw the signal.
#include <mpi.h>

#include <string>

namespace mgbench::runtime {

/// The exit status of a job that stopped on a signal with nothing lost (the batch scripts requeue it).
inline constexpr int kExitStopped = 75;

/// A stop signal of the kind already received, sooner than this after the first [s], is the same
/// request delivered along another path (a task's step signalled while a launcher or a site's
/// preemption tool forwards its own): one request, not an operator insisting.
inline constexpr double kRepeatIsTheSameRequestS = 5.0;

/// Installs handlers for SIGTERM and SIGUSR1 that record the request (async-signal-safe: a flag).
/// A second signal of the same kind, kRepeatIsTheSameRequestS or more after the first, ends the
/// process as the default action would, so an operator can still force it. Both are unblocked in
/// the calling thread (and so in the threads it starts afterwards), whatever mask the launcher
/// left. Idempotent.
///
/// Until defer_stops_to_step_boundaries() is called, the process is in its set-up (MPI start,
/// options, loading the model and data), which no step boundary interrupts and which may block (a
/// hung file system): a stop signal then ends the process at once, saying so on stderr, with exit
/// status kExitStopped -- nothing was trained and no results run exists yet, so nothing is lost.
/// Safe before the C++ libraries' static initialisers have run (the executable calls it from its
/// .preinit_array: a signal sent right after launch must find it).
void install_stop_handlers();

/// Names this process in the set-up stop message ("rank 3 on node12"). Call once the rank is known.
void name_process_for_stop_message(const std::string& who);

/// From now on a stop signal is recorded and honoured at the next step boundary (StopAgreement).
/// Call right before a run is created in a results file: from then on a stop must record it.
void defer_stops_to_step_boundaries() noexcept;

/// The first stop signal this process received (SIGTERM, SIGUSR1), or 0.
int stop_signal_received() noexcept;

/// Records a stop request as if `signal_number` had arrived (tests, and callers that stop for
/// reasons of their own).
void request_stop(int signal_number) noexcept;

/// Forgets a recorded request (a program that handled the stop and carries on, e.g. a test).
void clear_stop_request() noexcept;

/// "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", or "a stop request".
const char* stop_signal_name(int signal_number) noexcept;

class StopAgreement {
 public:
  /// Duplicates comm (collective).
  explicit StopAgreement(MPI_Comm comm);
  /// Completes an outstanding reduction (every rank has started the same number of them).
  ~StopAgreement();
  StopAgreement(const StopAgreement&) = delete;
  StopAgreement& operator=(const StopAgreement&) = delete;

  /// Call at every step boundary, on every rank, the same number of times. True on every rank at
  /// the same call, the call after the first one at which some rank had received a stop signal.
  /// Throws CommError when MPI fails.
  bool poll();

  /// The signal that made the job stop (the highest-numbered one any rank reported), 0 before.
  int agreed_signal() const { return agreed_signal_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Request request_ = MPI_REQUEST_NULL;
  int local_ = 0;
  int reduced_ = 0;
  int agreed_signal_ = 0;
};

}  // namespace mgbench::runtime
