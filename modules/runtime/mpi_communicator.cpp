#include "runtime/mpi_communicator.h"

#include <fmt/format.h>

#include "core/error.h"

namespace mgbench::runtime {
namespace {

class MpiWork final : public Work {
 public:
  MpiWork(MPI_Request request, const char* what) : request_(request), what_(what) {}
  ~MpiWork() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    const int rc = MPI_Wait(&request_, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) detail::throw_mpi_error(rc, what_, __FILE__, __LINE__);
  }
  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    MGBENCH_CHECK_MPI(MPI_Test(&request_, &done, MPI_STATUS_IGNORE));
    return done != 0;
  }

 private:
  MPI_Request request_;
  const char* what_;
};

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_SUM;
}

void require_host_contiguous(const torch::Tensor& t, const char* op) {
  MGBENCH_REQUIRE(t.device().is_cpu(), CommError, "MPI backend {}: tensor on {}, expected a CPU tensor", op,
                  t.device().str());
  MGBENCH_REQUIRE(t.is_contiguous(), CommError, "MPI backend {}: tensor must be contiguous", op);
  MGBENCH_REQUIRE(t.numel() <= std::numeric_limits<int>::max(), CommError,
                  "MPI backend {}: {} elements exceed MPI's int count", op, t.numel());
}

}  // namespace

MPI_Datatype mpi_datatype(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat32:
      return MPI_FLOAT;
    case torch::kFloat64:
      return MPI_DOUBLE;
    case torch::kInt32:
      return MPI_INT32_T;
    case torch::kInt64:
      return MPI_INT64_T;
    default:
      throw CommError(fmt::format("MPI backend: dtype {} cannot be reduced by MPI (use float32/float64/int32/int64)",
                                  c10::toString(type)));
  }
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  MGBENCH_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MGBENCH_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  MGBENCH_CHECK_MPI(MPI_Comm_size(comm_, &world_size_));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && finalized == 0) MPI_Comm_free(&comm_);
}

std::unique_ptr<Work> MpiCommunicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  require_host_contiguous(tensor, "all_reduce");
  MPI_Request request = MPI_REQUEST_NULL;
  MGBENCH_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, tensor.data_ptr(), static_cast<int>(tensor.numel()),
                                   mpi_datatype(tensor.scalar_type()), mpi_op(op), comm_, &request));
  return std::make_unique<MpiWork>(request, "MPI_Iallreduce");
}

std::unique_ptr<Work> MpiCommunicator::broadcast(torch::Tensor& tensor, int root) {
  require_host_contiguous(tensor, "broadcast");
  MPI_Request request = MPI_REQUEST_NULL;
  MGBENCH_CHECK_MPI(MPI_Ibcast(tensor.data_ptr(), static_cast<int>(tensor.numel()), mpi_datatype(tensor.scalar_type()),
                               root, comm_, &request));
  return std::make_unique<MpiWork>(request, "MPI_Ibcast");
}

void MpiCommunicator::barrier() { MGBENCH_CHECK_MPI(MPI_Barrier(comm_)); }

}  // namespace mgbench::runtime
