#include "runtime/mpi_communicator.h"

#include <sys/prctl.h>

#include <algorithm>
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
#include "core/watchdog.h"
#include "profile/cupti_collector.h"

namespace mgbench::runtime {
namespace {

/// What MPI reads and writes for one collective: host tensors of MPI types, the caller's own where
/// they are such (CPU float32/float64/int32/int64), else host copies (CUDA tensors; float16 and
/// bfloat16 as float32), written back into the caller's output when the collective completes.
struct Staged {
  torch::Tensor output;  // the caller's
  torch::Tensor recv;    // what MPI writes: output itself or its host copy
  torch::Tensor send;    // what MPI reads; undefined: MPI_IN_PLACE (the input is in recv)
  bool copy_back() const { return !recv.is_same(output); }
};

bool needs_host_copy(const torch::Tensor& t) {
  return !t.device().is_cpu() || t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16;
}

torch::ScalarType mpi_scalar_type(const torch::Tensor& t) {
  return t.scalar_type() == torch::kHalf || t.scalar_type() == torch::kBFloat16 ? torch::kFloat32 : t.scalar_type();
}

/// t as MPI reads it: t, or a host copy of its values.
torch::Tensor host_values(const torch::Tensor& t) {
  return needs_host_copy(t) ? t.to(torch::TensorOptions().device(torch::kCPU).dtype(mpi_scalar_type(t))) : t;
}

/// Stages an in-place collective (the input is the output's current values).
Staged stage_in_place(torch::Tensor& output) { return {output, host_values(output), {}}; }

/// Stages an out-of-place collective; MPI writes recv without reading it.
Staged stage_out_of_place(const torch::Tensor& input, torch::Tensor& output) {
  torch::Tensor recv =
      needs_host_copy(output)
          ? torch::empty(output.sizes(), torch::TensorOptions().device(torch::kCPU).dtype(mpi_scalar_type(output)))
          : output;
  return {output, recv, host_values(input)};
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
  static constexpr int kPollIntervalUs = 50;  // the longest pause between two MPI_Test calls
  static constexpr double kSpinS = 20e-6;     // tested back to back first
  double timeout_s = 0;                       // 0: none
  std::uint64_t started = 0;                  // collectives started, for the message
  std::mutex mutex;
  std::condition_variable wake;   // the thread: work queued or stop
  std::condition_variable ended;  // waiters: an operation is done
  std::deque<std::shared_ptr<Operation>> queue;
  bool stop = false;
  std::thread thread;

  explicit Worker(double timeout) : timeout_s(timeout), thread([this] { run(); }) {}
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
  /// Starts the operation and drives MPI's progress until it completes. Each MPI_Test may advance a
  /// step of the non-blocking collective's schedule, so the first kSpinS are tested back to back (a
  /// small collective completes in microseconds); then the pauses between tests double from 1 us to
  /// kPollIntervalUs, so a long collective does not take a core from backward's compute (a blocking
  /// MPI call spins; with a rank per core that slowed training by 10-15 % here). The thread's timer
  /// slack is 1 us (run()), else every pause would last Linux's default 50 us.
  int drive(Operation& op) {
    ++started;
    const double begin = now_s();
    // Past timeout_s (a peer died, hangs or is stopped) the watchdog names the collective and
    // where every rank is, and ends the job.
    const watchdog::Deadline deadline(fmt::format("{} #{}", op.what, started), timeout_s);
    MPI_Request request = MPI_REQUEST_NULL;
    int rc = op.start(&request);
    int pause_us = 0;
    for (int done = 0; rc == MPI_SUCCESS && done == 0;) {
      rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (done != 0) break;
      if (now_s() - begin < kSpinS) continue;
      pause_us = std::min(pause_us == 0 ? 1 : 2 * pause_us, kPollIntervalUs);
      std::this_thread::sleep_for(std::chrono::microseconds(pause_us));
    }
    return rc;
  }

  void run() {
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);  // 1 us: pauses as short as asked (drive)
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
    if (op_->staged.copy_back()) {
      const profile::CopyScope staging(profile::CopyPurpose::kCollectiveStaging);
      op_->staged.output.copy_(op_->staged.recv);
    }
    // MPI is done with the buffers: the host copies (fp32 staging of bf16/fp16, CUDA tensors) and the
    // references to the caller's tensors go now, not when the Work does (FSDP keeps its Works, for
    // their seconds, to the end of the step: every unit's staged gather and reduce-scatter alive at once).
    op_->staged = {};
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

/// check_collective, and counts within MPI's int.
void require_pair(const torch::Tensor& input, const torch::Tensor& output, const char* op, std::int64_t output_factor,
                  std::int64_t input_factor) {
  check_collective(input, output, "MPI", op, output_factor, input_factor);
  MGBENCH_REQUIRE(std::max(input.numel(), output.numel()) <= std::numeric_limits<int>::max(), CommError,
                  "MPI backend {}: {} elements exceed MPI's int count", op, std::max(input.numel(), output.numel()));
}

/// True when `part` starts `offset` elements into `whole` (same dtype): NCCL's in-place layout.
bool starts_at(const torch::Tensor& part, const torch::Tensor& whole, std::int64_t offset) {
  return part.data_ptr() == static_cast<const char*>(whole.data_ptr()) + offset * whole.element_size();
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
    case torch::kUInt8:  // packed bytes (FSDP's NF4 weights)
      return MPI_UINT8_T;
    case torch::kInt8:
      return MPI_INT8_T;
    default:
      throw CommError(fmt::format("MPI backend: dtype {} has no MPI type (float32/float64/int32/int64/uint8/int8)",
                                  c10::toString(type)));
  }
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s) {
  MGBENCH_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MGBENCH_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  MGBENCH_CHECK_MPI(MPI_Comm_size(comm_, &world_size_));
  worker_ = std::make_unique<Worker>(timeout_s);
}

MpiCommunicator::~MpiCommunicator() {
  worker_.reset();  // what was queued runs first: the peers are in those collectives too
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && finalized == 0) MPI_Comm_free(&comm_);
}

std::unique_ptr<Work> MpiCommunicator::all_reduce(const torch::Tensor& input, torch::Tensor& output, ReduceOp op) {
  require_pair(input, output, "all_reduce", 1, 1);
  Staged staged = input.data_ptr() == output.data_ptr() ? stage_in_place(output) : stage_out_of_place(input, output);
  const MPI_Datatype type = mpi_datatype(staged.recv.scalar_type());
  const void* send = staged.send.defined() ? staged.send.data_ptr() : MPI_IN_PLACE;
  void* recv = staged.recv.data_ptr();
  const int count = static_cast<int>(output.numel());
  const MPI_Op mpi = mpi_op(op);
  MPI_Comm comm = comm_;
  return std::make_unique<MpiWork>(*worker_, worker_->submit("MPI_Iallreduce", std::move(staged), [=](MPI_Request* r) {
    return MPI_Iallreduce(send, recv, count, type, mpi, comm, r);
  }));
}

std::unique_ptr<Work> MpiCommunicator::broadcast(const torch::Tensor& input, torch::Tensor& output, int root) {
  require_pair(input, output, "broadcast", 1, 1);
  // MPI's broadcast is in place: out of place, root's input is first copied into the output.
  if (rank_ == root && input.data_ptr() != output.data_ptr()) output.copy_(input);
  Staged staged = stage_in_place(output);
  const MPI_Datatype type = mpi_datatype(staged.recv.scalar_type());
  void* data = staged.recv.data_ptr();
  const int count = static_cast<int>(output.numel());
  MPI_Comm comm = comm_;
  return std::make_unique<MpiWork>(*worker_, worker_->submit("MPI_Ibcast", std::move(staged), [=](MPI_Request* r) {
    return MPI_Ibcast(data, count, type, root, comm, r);
  }));
}

std::unique_ptr<Work> MpiCommunicator::all_gather(const torch::Tensor& input, torch::Tensor& output) {
  require_pair(input, output, "all_gather", world_size_, 1);
  const std::int64_t n = input.numel();
  Staged staged = starts_at(input, output, rank_ * n) ? stage_in_place(output) : stage_out_of_place(input, output);
  const MPI_Datatype type = mpi_datatype(staged.recv.scalar_type());
  const void* send = staged.send.defined() ? staged.send.data_ptr() : MPI_IN_PLACE;
  void* recv = staged.recv.data_ptr();
  const int count = static_cast<int>(n);
  MPI_Comm comm = comm_;
  return std::make_unique<MpiWork>(*worker_, worker_->submit("MPI_Iallgather", std::move(staged), [=](MPI_Request* r) {
    return MPI_Iallgather(send, count, type, recv, count, type, comm, r);
  }));
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter(const torch::Tensor& input, torch::Tensor& output, ReduceOp op) {
  require_pair(input, output, "reduce_scatter", 1, world_size_);
  // MPI's in-place reduce-scatter has another layout than NCCL's (its result starts the buffer):
  // NCCL's in-place case reads from a copy of the input.
  Staged staged = stage_out_of_place(starts_at(output, input, rank_ * output.numel()) ? input.clone() : input, output);
  const MPI_Datatype type = mpi_datatype(staged.recv.scalar_type());
  const void* send = staged.send.data_ptr();
  void* recv = staged.recv.data_ptr();
  const int count = static_cast<int>(output.numel());
  const MPI_Op mpi = mpi_op(op);
  MPI_Comm comm = comm_;
  return std::make_unique<MpiWork>(*worker_,
                                   worker_->submit("MPI_Ireduce_scatter_block", std::move(staged), [=](MPI_Request* r) {
                                     return MPI_Ireduce_scatter_block(send, recv, count, type, mpi, comm, r);
                                   }));
}

void MpiCommunicator::barrier() {
  MPI_Comm comm = comm_;
  MpiWork(*worker_, worker_->submit("MPI_Ibarrier", {}, [=](MPI_Request* r) { return MPI_Ibarrier(comm, r); })).wait();
}

}  // namespace mgbench::runtime
