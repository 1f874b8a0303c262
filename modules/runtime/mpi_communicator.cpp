#include "runtime/mpi_communicator.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/timer.h"

namespace mgbench::runtime {
namespace {

/// A tensor as MPI sees it: the tensor itself when it is a CPU tensor of an MPI type, else a
/// host copy (CUDA tensors, half types) written back when the collective completes.
struct Staged {
  torch::Tensor target;  // the caller's tensor
  torch::Tensor buffer;  // what MPI reads and writes
  bool copy_back() const { return !buffer.is_same(target); }
};

Staged stage(torch::Tensor& t) {
  const bool half = t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16;
  if (t.device().is_cpu() && !half) return {t, t};
  return {t, t.to(torch::TensorOptions().device(torch::kCPU).dtype(half ? torch::kFloat32 : t.scalar_type()))};
}

class MpiWork final : public Work {
 public:
  MpiWork(MPI_Request request, const char* what, Staged staged)
      : request_(request), what_(what), staged_(std::move(staged)), launched_s_(now_s()) {}
  ~MpiWork() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  void wait() override {
    if (request_ != MPI_REQUEST_NULL) {
      const int rc = MPI_Wait(&request_, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) detail::throw_mpi_error(rc, what_, __FILE__, __LINE__);
      completed();
    }
  }
  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    MGBENCH_CHECK_MPI(MPI_Test(&request_, &done, MPI_STATUS_IGNORE));
    if (done != 0) completed();
    return done != 0;
  }
  double seconds_since_start_of(const Work& first) const override {
    const auto* f = dynamic_cast<const MpiWork*>(&first);
    return f == nullptr ? 0.0 : done_s_ - f->launched_s_;
  }

 private:
  void completed() {
    done_s_ = now_s();
    if (staged_.copy_back()) staged_.target.copy_(staged_.buffer);
  }

  MPI_Request request_;
  const char* what_;
  Staged staged_;
  double launched_s_;
  double done_s_ = 0;
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

void require_contiguous(const torch::Tensor& t, const char* op) {
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
  require_contiguous(tensor, "all_reduce");
  Staged staged = stage(tensor);
  const MPI_Datatype type = mpi_datatype(staged.buffer.scalar_type());
  MPI_Request request = MPI_REQUEST_NULL;
  MGBENCH_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, staged.buffer.data_ptr(), static_cast<int>(tensor.numel()), type,
                                   mpi_op(op), comm_, &request));
  return std::make_unique<MpiWork>(request, "MPI_Iallreduce", std::move(staged));
}

std::unique_ptr<Work> MpiCommunicator::broadcast(torch::Tensor& tensor, int root) {
  require_contiguous(tensor, "broadcast");
  Staged staged = stage(tensor);
  const MPI_Datatype type = mpi_datatype(staged.buffer.scalar_type());
  MPI_Request request = MPI_REQUEST_NULL;
  MGBENCH_CHECK_MPI(
      MPI_Ibcast(staged.buffer.data_ptr(), static_cast<int>(tensor.numel()), type, root, comm_, &request));
  return std::make_unique<MpiWork>(request, "MPI_Ibcast", std::move(staged));
}

void MpiCommunicator::barrier() { MGBENCH_CHECK_MPI(MPI_Barrier(comm_)); }

}  // namespace mgbench::runtime
