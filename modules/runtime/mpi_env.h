#pragma once
// The MPI side of a rank: initialisation, identity (rank, local rank, world size, host) and
// the way a failing rank brings the whole job down.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mgbench::runtime {

/// Throws CommError naming the thread level provided (MPI_Init_thread's `provided`) and the MPI
/// library when it is below MPI_THREAD_MULTIPLE, which mgbench needs: the MPI backend's
/// collectives start on autograd's thread, the watchdog calls MPI_Abort from its own.
void require_thread_multiple(int provided, const std::string& library);

/// "Open MPI v4.1.4" (MPI_Get_library_version up to its first comma or line break); callable
/// before MPI_Init.
std::string mpi_library_version();

class MpiEnvironment {
 public:
  /// MPI_Init_thread (MPI_THREAD_MULTIPLE requested: gradient hooks may run on autograd threads),
  /// unless MPI is already initialised (a host program or a test harness owns it).
  /// Local rank and local size come from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). Throws
  /// CommError (require_thread_multiple) when MPI provides less than MPI_THREAD_MULTIPLE.
  MpiEnvironment(int* argc, char*** argv);
  /// MPI_Finalize when this object initialised MPI, unless the job was aborted.
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  const std::string& hostname() const { return hostname_; }
  MPI_Comm world() const { return MPI_COMM_WORLD; }
  /// mpi_library_version().
  std::string library_version() const;
  /// Host names of all ranks, comma-separated in rank order, duplicates removed. Collective.
  std::string all_hosts() const;
  /// value of every rank of this rank's node, in local-rank order. Collective over the world.
  std::vector<std::string> node_allgather(const std::string& value) const;

  void barrier() const;

  /// A value of every rank summarised: its minimum, mean and maximum over the ranks. Collective.
  struct Spread {
    double min = 0, mean = 0, max = 0;
  };
  Spread spread(double value) const;
  /// The sum of value over the ranks. Collective.
  std::int64_t sum(std::int64_t value) const;

  /// Ends every rank of the job now (MPI_Abort). Never returns.
  [[noreturn]] void abort(int exit_code) const;

 private:
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  bool owns_mpi_ = false;
  MPI_Comm node_ = MPI_COMM_NULL;  // the ranks of this node (MPI_Comm_split_type)
  std::string hostname_;
};

}  // namespace mgbench::runtime
