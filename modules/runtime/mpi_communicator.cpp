#include "runtime/mpi_communicator.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
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

/// One queued collective, shared by its Work and the communication thread.
struct Operation {
  const char* what = "";
  std::function<int(MPI_Request*)> start;  // starts the non-blocking MPI call; its return code
  Staged staged;
  double launched_s = 0;  // queued (the caller's launch)
  double done_s = 0;      // the MPI call returned
  int rc = MPI_SUCCESS;
  bool done = false;  // guarded by the worker's mutex
};

}  // namespace

struct MpiCommunicator::Worker {
  static constexpr int kPollIntervalUs = 50;
  double timeout_s = 0;  // 0: none
  int rank = 0;
  std::uint64_t started = 0;  // collectives started, for the message
  std::mutex mutex;
  std::condition_variable wake;   // the thread: work queued or stop
  std::condition_variable ended;  // waiters: an operation is done
  std::deque<std::shared_ptr<Operation>> queue;
  bool stop = false;
  std::thread thread;

  Worker(double timeout, int rank_in_comm) : timeout_s(timeout), rank(rank_in_comm), thread([this] { run(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    wake.notify_all();
    thread.join();
  }

  std::shared_ptr<Operation> submit(const char* what, Staged staged, std::function<int(MPI_Request*)> start) {
    auto op = std::make_shared<Operation>();
    op->what = what;
    op->staged = std::move(staged);
    op->start = std::move(start);
    op->launched_s = now_s();
    {
      std::lock_guard<std::mutex> lock(mutex);
      queue.push_back(op);
    }
    wake.notify_one();
    return op;
  }

  void await(Operation& op) {
    std::unique_lock<std::mutex> lock(mutex);
    ended.wait(lock, [&] { return op.done; });
  }

  bool is_done(const Operation& op) {
    std::lock_guard<std::mutex> lock(mutex);
    return op.done;
  }

 private:
  /// Starts the operation and drives MPI's progress until it completes: MPI_Test, then a short
  /// sleep, so this thread does not take a core from backward's compute (a blocking MPI call
  /// spins; with a rank per core that slowed training by 10-15 % here).
  int drive(Operation& op) {
    ++started;
    const double deadline = timeout_s > 0 ? now_s() + timeout_s : 0;
    MPI_Request request = MPI_REQUEST_NULL;
    int rc = op.start(&request);
    for (int done = 0; rc == MPI_SUCCESS && done == 0;) {
      rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (done != 0) break;
      if (deadline > 0 && now_s() > deadline) {
        // The job cannot go on: its peers wait in the same collective or are gone.
        log::error(
            "rank {}: {} #{} did not complete in {:.0f} s (a peer rank died, hangs or is stopped); aborting "
            "the job (--comm-timeout)",
            rank, op.what, started, timeout_s);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(kPollIntervalUs));
    }
    return rc;
  }

  void run() {
    for (;;) {
      std::shared_ptr<Operation> op;
      {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;  // stop, with nothing left to run
        op = queue.front();
        queue.pop_front();
      }
      const int rc = drive(*op);
      {
        std::lock_guard<std::mutex> lock(mutex);
        op->rc = rc;
        op->done_s = now_s();
        op->done = true;
      }
      ended.notify_all();
    }
  }
};

namespace {

class MpiWork final : public Work {
 public:
  MpiWork(MpiCommunicator::Worker& worker, std::shared_ptr<Operation> op) : worker_(worker), op_(std::move(op)) {}
  ~MpiWork() override {
    if (!finished_) worker_.await(*op_);  // MPI must not write into a buffer that is gone
  }
  void wait() override {
    if (finished_) return;
    worker_.await(*op_);
    complete();
  }
  bool test() override {
    if (!finished_ && worker_.is_done(*op_)) complete();
    return finished_;
  }
  double seconds_since_start_of(const Work& first) const override {
    const auto* f = dynamic_cast<const MpiWork*>(&first);
    return f == nullptr ? 0.0 : op_->done_s - f->op_->launched_s;
  }

 private:
  /// On the caller's thread: the error, or the staged result written back.
  void complete() {
    finished_ = true;
    if (op_->rc != MPI_SUCCESS) detail::throw_mpi_error(op_->rc, op_->what, __FILE__, __LINE__);
    if (op_->staged.copy_back()) op_->staged.target.copy_(op_->staged.buffer);
  }

  MpiCommunicator::Worker& worker_;
  std::shared_ptr<Operation> op_;
  bool finished_ = false;
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

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s) {
  MGBENCH_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MGBENCH_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  MGBENCH_CHECK_MPI(MPI_Comm_size(comm_, &world_size_));
  worker_ = std::make_unique<Worker>(timeout_s, rank_);
}

MpiCommunicator::~MpiCommunicator() {
  worker_.reset();  // what was queued runs first: the peers are in those collectives too
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && finalized == 0) MPI_Comm_free(&comm_);
}

std::unique_ptr<Work> MpiCommunicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  require_contiguous(tensor, "all_reduce");
  Staged staged = stage(tensor);
  const MPI_Datatype type = mpi_datatype(staged.buffer.scalar_type());
  void* data = staged.buffer.data_ptr();
  const int count = static_cast<int>(tensor.numel());
  const MPI_Op mpi = mpi_op(op);
  MPI_Comm comm = comm_;
  return std::make_unique<MpiWork>(*worker_, worker_->submit("MPI_Iallreduce", std::move(staged), [=](MPI_Request* r) {
    return MPI_Iallreduce(MPI_IN_PLACE, data, count, type, mpi, comm, r);
  }));
}

std::unique_ptr<Work> MpiCommunicator::broadcast(torch::Tensor& tensor, int root) {
  require_contiguous(tensor, "broadcast");
  Staged staged = stage(tensor);
  const MPI_Datatype type = mpi_datatype(staged.buffer.scalar_type());
  void* data = staged.buffer.data_ptr();
  const int count = static_cast<int>(tensor.numel());
  MPI_Comm comm = comm_;
  return std::make_unique<MpiWork>(*worker_, worker_->submit("MPI_Ibcast", std::move(staged), [=](MPI_Request* r) {
    return MPI_Ibcast(data, count, type, root, comm, r);
  }));
}

void MpiCommunicator::barrier() {
  MPI_Comm comm = comm_;
  MpiWork(*worker_, worker_->submit("MPI_Ibarrier", {}, [=](MPI_Request* r) { return MPI_Ibarrier(comm, r); })).wait();
}

}  // namespace mgbench::runtime
