#include "runtime/stop_request.h"

#include <pthread.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <tuple>

#include <fmt/format.h>

#include "core/error.h"
#include "core/watchdog.h"

namespace mgbench::runtime {
namespace {

// Lock-free atomics: safe in a handler, and handlers may run on two threads at once.
std::atomic<int> g_stop_signal{0};
std::atomic<std::int64_t> g_first_signal_ns{0};  // CLOCK_MONOTONIC when g_stop_signal was set
volatile std::sig_atomic_t g_in_setup = 1;       // until defer_stops_to_step_boundaries()
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<std::int64_t>::is_always_lock_free);

std::int64_t monotonic_ns() noexcept {  // clock_gettime is async-signal-safe (POSIX, signal-safety(7))
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return std::int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

// Records the first stop signal and when it came; later ones leave both.
void record_first(int signal_number) noexcept {
  if (g_stop_signal.load() != 0) return;
  g_first_signal_ns.store(monotonic_ns());  // first: a handler that sees the signal sees its time
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, signal_number);
}

constexpr auto kRepeatIsTheSameRequestNs = static_cast<std::int64_t>(kRepeatIsTheSameRequestS * 1e9);

// The set-up stop messages, formatted ahead (a handler may only write(2) them).
constexpr std::size_t kMessageBytes = 512;
char g_term_message[kMessageBytes] = {};
char g_usr1_message[kMessageBytes] = {};
std::size_t g_term_length = 0;
std::size_t g_usr1_length = 0;

void format_messages(const std::string& who) {
  for (const auto& [signal_name, buffer, length] :
       {std::tuple{"SIGTERM", g_term_message, &g_term_length}, std::tuple{"SIGUSR1", g_usr1_message, &g_usr1_length}}) {
    const int n = std::snprintf(buffer, kMessageBytes,
                                "mgbench (%s): stopped on %s during set-up, before the first step: nothing was "
                                "trained or written, nothing to resume (exit %d)\n",
                                who.c_str(), signal_name, kExitStopped);
    *length = n < 0 ? 0 : std::min(static_cast<std::size_t>(n), kMessageBytes - 1);
  }
}

extern "C" void on_stop_signal(int signal_number) {
  if (g_in_setup != 0) {
    const bool term = signal_number == SIGTERM;
    const ssize_t ignored =
        ::write(STDERR_FILENO, term ? g_term_message : g_usr1_message, term ? g_term_length : g_usr1_length);
    (void)ignored;
    ::_exit(kExitStopped);
  }
  if (g_stop_signal.load() == signal_number) {
    // The same request delivered along several paths arrives within moments: one request.
    if (monotonic_ns() - g_first_signal_ns.load() < kRepeatIsTheSameRequestNs) return;
    // Asked again: stop waiting for a step boundary.
    std::signal(signal_number, SIG_DFL);
    std::raise(signal_number);
    return;
  }
  record_first(signal_number);
}

}  // namespace

void install_stop_handlers() {
  if (g_term_length == 0) {
    // snprintf, not fmt: this may run from the executable's .preinit_array (app/main.cpp), before the
    // C++ libraries' initialisers.
    char who[32];
    std::snprintf(who, sizeof who, "pid %d", static_cast<int>(::getpid()));
    format_messages(who);
  }
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking reads and MPI progress calls carry on
  for (int s : {SIGTERM, SIGUSR1}) sigaction(s, &action, nullptr);
  // A launcher may start us with them blocked (the mask is inherited across exec): a handler that
  // never runs would turn a preemption notice into a kill at the time limit.
  sigset_t stops;
  sigemptyset(&stops);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGUSR1);
  pthread_sigmask(SIG_UNBLOCK, &stops, nullptr);
}

void name_process_for_stop_message(const std::string& who) {
  // Blocked while rewritten, so that a handler never writes a half-formatted message.
  sigset_t stops, previous;
  sigemptyset(&stops);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &stops, &previous);
  format_messages(who);
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

void defer_stops_to_step_boundaries() noexcept { g_in_setup = 0; }

int stop_signal_received() noexcept { return g_stop_signal.load(); }

void request_stop(int signal_number) noexcept { record_first(signal_number); }

void clear_stop_request() noexcept { g_stop_signal.store(0); }

const char* stop_signal_name(int signal_number) noexcept {
  switch (signal_number) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGINT:
      return "SIGINT";
    default:
      return "a stop request";
  }
}

StopAgreement::StopAgreement(MPI_Comm comm) { MGBENCH_CHECK_MPI(MPI_Comm_dup(comm, &comm_)); }

StopAgreement::~StopAgreement() {
  if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

bool StopAgreement::poll() {
  if (agreed_signal_ != 0) return true;
  if (request_ != MPI_REQUEST_NULL) {
    // Started a step ago, so normally long complete; a rank that never reaches this boundary
    // (stopped, hung) leaves it open: the watchdog ends the job after --comm-timeout.
    const watchdog::Deadline deadline("the stop agreement at a step boundary");
    MGBENCH_CHECK_MPI(MPI_Wait(&request_, MPI_STATUS_IGNORE));
    if (reduced_ != 0) {
      agreed_signal_ = reduced_;
      return true;
    }
  }
  local_ = g_stop_signal.load();
  MGBENCH_CHECK_MPI(MPI_Iallreduce(&local_, &reduced_, 1, MPI_INT, MPI_MAX, comm_, &request_));
  return false;
}

}  // namespace mgbench::runtime
