#include "runtime/mpi_env.h"

#include <unistd.h>

#include <cstdlib>
#include <set>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "core/mpi_strings.h"
#include "core/watchdog.h"

namespace mgbench::runtime {

MpiEnvironment::MpiEnvironment(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized == 0) {
    MGBENCH_CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    owns_mpi_ = true;
  } else {
    MGBENCH_CHECK_MPI(MPI_Query_thread(&provided));
  }
  // Errors come back as return codes, checked by MGBENCH_CHECK_MPI, instead of aborting silently.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MGBENCH_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MGBENCH_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world_size_));
  MGBENCH_CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_));
  MGBENCH_CHECK_MPI(MPI_Comm_rank(node_, &local_rank_));
  MGBENCH_CHECK_MPI(MPI_Comm_size(node_, &local_size_));
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  hostname_ = host;
  // Every rank refuses together (the level is the library's, the same on every rank), before any
  // thread of mgbench's calls MPI.
  try {
    require_thread_multiple(provided, library_version());
  } catch (...) {
    MPI_Comm_free(&node_);
    if (owns_mpi_) MPI_Finalize();
    throw;
  }
  watchdog::start();  // deadlines of blocking stages, and the census answers of this rank

  // Cross-check with the launcher's idea of the local rank (Open MPI's mpirun, SLURM's srun).
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const char* v = std::getenv(var); v != nullptr && std::atoi(v) != local_rank_) {
      log::warn("{}={} differs from the local rank {} found by MPI_Comm_split_type; using {}", var, v, local_rank_,
                local_rank_);
    }
  }
}

void require_thread_multiple(int provided, const std::string& library) {
  if (provided >= MPI_THREAD_MULTIPLE) return;
  const char* level = provided == MPI_THREAD_SINGLE       ? "MPI_THREAD_SINGLE"
                      : provided == MPI_THREAD_FUNNELED   ? "MPI_THREAD_FUNNELED"
                      : provided == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
                                                          : "an unknown level";
  throw CommError(fmt::format(
      "MPI: the library provides {} where mgbench needs MPI_THREAD_MULTIPLE (gradient all-reduces are "
      "started from autograd's thread and the watchdog aborts from its own): {}. Use an MPI built with thread "
      "support (Open MPI: --enable-mpi-thread-multiple, the default since 3.0; with UCX, a UCX built with "
      "threads)",
      level, library));
}

MpiEnvironment::~MpiEnvironment() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized == 0) {
    watchdog::stop();
    if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
    if (owns_mpi_) MPI_Finalize();
  }
}

std::vector<std::string> MpiEnvironment::node_allgather(const std::string& value) const {
  return allgather_strings(node_, value);  // under a watchdog deadline (core/mpi_strings.h)
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string s(text, static_cast<std::size_t>(length));
  if (const auto nl = s.find_first_of(",\n"); nl != std::string::npos) s.resize(nl);
  return s;
}

std::string MpiEnvironment::library_version() const { return mpi_library_version(); }

std::string MpiEnvironment::all_hosts() const {
  constexpr int kLen = 256;
  std::vector<char> all(static_cast<std::size_t>(kLen) * static_cast<std::size_t>(world_size_), '\0');
  std::vector<char> mine(kLen, '\0');
  hostname_.copy(mine.data(), kLen - 1);
  const watchdog::Deadline deadline("gathering the host names");
  MGBENCH_CHECK_MPI(MPI_Allgather(mine.data(), kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, MPI_COMM_WORLD));
  std::set<std::string> seen;
  std::ostringstream out;
  for (int r = 0; r < world_size_; ++r) {
    std::string h(&all[static_cast<std::size_t>(r) * kLen]);
    if (seen.insert(h).second) out << (seen.size() > 1 ? "," : "") << h;
  }
  return out.str();
}

void MpiEnvironment::barrier() const {
  const watchdog::Deadline deadline("a barrier of all ranks");
  MGBENCH_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
}

MpiEnvironment::Spread MpiEnvironment::spread(double value) const {
  double low_high[2] = {value, -value};  // one MPI_MIN gives both
  double total = value;
  const watchdog::Deadline deadline("summarising a value over the ranks");
  MGBENCH_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, low_high, 2, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD));
  MGBENCH_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
  return {low_high[0], total / world_size_, -low_high[1]};
}

std::int64_t MpiEnvironment::sum(std::int64_t value) const {
  const watchdog::Deadline deadline("summing a value over the ranks");
  MGBENCH_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
  return value;
}

void MpiEnvironment::abort(int exit_code) const { watchdog::abort_job(exit_code); }

}  // namespace mgbench::runtime
