#include "runtime/agreement.h"

#include <chrono>
#include <exception>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/watchdog.h"

namespace mgbench::runtime {

bool all_succeed(const MpiEnvironment& env, std::string_view stage, const std::function<void()>& step) {
  std::string error;
  try {
    step();
  } catch (const std::exception& e) {
    error = e.what();
  }
  // The lowest failing rank (world size: none), agreed without blocking: a rank that failed and
  // whose peers do not arrive within kSayNowS says why at once, since a peer stuck in the stage
  // ends the job through the watchdog (its census) and this line is then the only reason given.
  constexpr double kSayNowS = 2.0;
  int mine = error.empty() ? env.world_size() : env.rank();
  int lowest = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  MGBENCH_CHECK_MPI(MPI_Iallreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, env.world(), &request));
  const watchdog::Deadline deadline(fmt::format("the agreement after {}", stage));
  const double begin = now_s();
  bool said = false;
  for (int done = 0;;) {
    MGBENCH_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done != 0) break;
    if (!said && !error.empty() && now_s() - begin > kSayNowS) {
      log::error("{} failed on rank {} (waiting for the other ranks): {}", stage, env.rank(), error);
      said = true;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (lowest == env.world_size()) return true;
  if (env.rank() == lowest && !said) {
    log::error("{} failed{}: {}", stage, env.world_size() > 1 ? fmt::format(" on rank {}", env.rank()) : "", error);
  }
  return false;
}

}  // namespace mgbench::runtime
