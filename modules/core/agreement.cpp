#include "core/agreement.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "core/mpi_strings.h"
#include "core/timer.h"
#include "core/watchdog.h"

namespace mgbench {

Agreement agree(MPI_Comm comm, std::string_view stage, const std::function<void()>& step) {
  int rank = 0, world_size = 1;
  MGBENCH_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  MGBENCH_CHECK_MPI(MPI_Comm_size(comm, &world_size));
  std::string error;
  try {
    step();
  } catch (const std::exception& e) {
    error = error_message(e);
  }
  Agreement a;
  const double timeout_s = watchdog::default_timeout();
  const double say_now_s = timeout_s > 0 ? std::min(2.0, timeout_s / 2) : 2.0;
  const int mine = error.empty() ? world_size : rank;
  int lowest = world_size;
  MPI_Request request = MPI_REQUEST_NULL;
  MGBENCH_CHECK_MPI(MPI_Iallreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, comm, &request));
  {
    const watchdog::Deadline deadline(fmt::format("the agreement after {}", stage));
    const double begin = now_s();
    for (int done = 0;;) {
      MGBENCH_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
      if (done != 0) break;
      if (!a.reported && !error.empty() && now_s() - begin > say_now_s) {
        log::error("{} failed on rank {} (waiting for the other ranks): {}", stage, rank, error);
        a.reported = true;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  if (lowest == world_size) return a;
  a.failed_rank = lowest;
  a.error = world_size == 1 ? error : allgather_strings(comm, error)[static_cast<std::size_t>(lowest)];
  return a;
}

}  // namespace mgbench
