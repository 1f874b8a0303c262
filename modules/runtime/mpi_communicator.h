#pragma once
// Communicator backend on MPI non-blocking collectives. CPU tensors are reduced in place; CUDA
// tensors are staged through host memory (copied to the host at launch, back at wait()), which
// lets several ranks share one GPU in tests, where NCCL refuses. float16/bfloat16 are reduced
// as float32 (MPI has no such types) and rounded back.
#include <mpi.h>

#include "runtime/communicator.h"

namespace mgbench::runtime {

class MpiCommunicator final : public Communicator {
 public:
  /// Duplicates comm, so mgbench's collectives never mix with other traffic on it.
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "mpi"; }
  /// Throws CommError for non-contiguous tensors and dtypes MPI cannot reduce (see mpi_datatype).
  std::unique_ptr<Work> all_reduce(torch::Tensor& tensor, ReduceOp op) override;
  std::unique_ptr<Work> broadcast(torch::Tensor& tensor, int root) override;
  void barrier() override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int world_size_ = 1;
};

/// The MPI datatype of a torch dtype; throws CommError for types MPI cannot reduce.
MPI_Datatype mpi_datatype(torch::ScalarType type);

}  // namespace mgbench::runtime
