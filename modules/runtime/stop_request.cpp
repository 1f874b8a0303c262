#include "runtime/stop_request.h"

#include <csignal>

#include "core/error.h"

namespace mgbench::runtime {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int signal_number) {
  if (g_stop_signal == signal_number) {
    // Asked twice: stop waiting for a step boundary.
    std::signal(signal_number, SIG_DFL);
    std::raise(signal_number);
    return;
  }
  if (g_stop_signal == 0) g_stop_signal = signal_number;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking reads and MPI progress calls carry on
  for (int s : {SIGTERM, SIGUSR1}) sigaction(s, &action, nullptr);
}

int stop_signal_received() noexcept { return g_stop_signal; }

void request_stop(int signal_number) noexcept {
  if (g_stop_signal == 0) g_stop_signal = signal_number;
}

void clear_stop_request() noexcept { g_stop_signal = 0; }

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
    MGBENCH_CHECK_MPI(MPI_Wait(&request_, MPI_STATUS_IGNORE));
    if (reduced_ != 0) {
      agreed_signal_ = reduced_;
      return true;
    }
  }
  local_ = g_stop_signal;
  MGBENCH_CHECK_MPI(MPI_Iallreduce(&local_, &reduced_, 1, MPI_INT, MPI_MAX, comm_, &request_));
  return false;
}

}  // namespace mgbench::runtime
