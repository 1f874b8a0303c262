#pragma once
// Communicator backend on MPI, with a communication thread. Every collective is queued, in the
// caller's order, to the communicator's own thread, which starts it as a non-blocking MPI call
// (MPI_Iallreduce, MPI_Ibcast, MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ibarrier) and drives it
// to completion while the caller goes on: gradient all-reduces launched
// from autograd's hooks overlap the rest of backward on CPUs, where Open MPI's non-blocking
// collectives progress only inside MPI calls (and a blocking MPI_Allreduce was 2x faster than
// MPI_Iallreduce for 8.9 MB here). One thread issues all of a communicator's collectives, so
// every rank issues them in the same order. As PyTorch's ProcessGroupGloo does with its worker
// threads.
//
// CPU tensors are read and written where they are; CUDA tensors are staged through host memory
// (copied to the host at launch, back at wait() on the caller's thread and stream), which lets
// several ranks share one GPU in tests, where NCCL refuses. float16/bfloat16 are reduced as float32
// (MPI has no such types) and rounded back. A collective of more than 8 MiB a rank runs as a
// sequence of MPI calls over pieces of every rank's block, converted through the thread's two
// staging buffers where needed: the host memory a collective adds (fp32 copies of bf16 tensors,
// Open MPI's own temporaries: libnbc's reduce-scatter and all-reduce keep about twice their input)
// stays a few times 8 MiB, not a multiple of the tensor (a bf16 Llama's 128k-vocabulary head
// added 0.5 GiB a rank per in-flight collective). Needs MPI_THREAD_MULTIPLE (runtime/mpi_env.h
// checks it).
#include <mpi.h>

#include <memory>

#include "runtime/communicator.h"

namespace mgbench::runtime {

class MpiCommunicator final : public Communicator {
 public:
  /// Duplicates comm, so mgbench's collectives never mix with other traffic on it, and starts the
  /// communication thread. timeout_s > 0: a collective not complete after that long (a peer rank
  /// died, hangs or is stopped) ends the job through the process's watchdog (core/watchdog.h,
  /// started by MpiEnvironment), which names the collective and where every rank is, as the NCCL
  /// backend's watchdog does (--comm-timeout); 0: no deadline.
  explicit MpiCommunicator(MPI_Comm comm, double timeout_s = 0);
  /// Runs what is queued, stops the thread, frees the duplicate.
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "mpi"; }
  using Communicator::all_reduce;
  using Communicator::broadcast;
  /// Throw CommError for non-contiguous tensors, mismatched sizes or dtypes, and dtypes MPI cannot
  /// reduce (see mpi_datatype); an MPI error is thrown by the Work's wait(). A CPU input and output
  /// are read and written by the communication thread until the Work completes: the caller leaves
  /// them alone until then (as NCCL's stream order requires).
  std::unique_ptr<Work> all_reduce(const torch::Tensor& input, torch::Tensor& output, ReduceOp op) override;
  std::unique_ptr<Work> broadcast(const torch::Tensor& input, torch::Tensor& output, int root) override;
  std::unique_ptr<Work> all_gather(const torch::Tensor& input, torch::Tensor& output) override;
  std::unique_ptr<Work> reduce_scatter(const torch::Tensor& input, torch::Tensor& output, ReduceOp op) override;
  /// Queued behind every collective launched before it; returns when all ranks reached it.
  void barrier() override;

  struct Worker;  // the communication thread and its queue

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int world_size_ = 1;
  std::unique_ptr<Worker> worker_;
};

/// The MPI datatype of a torch dtype (fp16 / bf16 are staged as fp32 before); throws CommError
/// for another (bool, complex, fp8).
MPI_Datatype mpi_datatype(torch::ScalarType type);

}  // namespace mgbench::runtime
