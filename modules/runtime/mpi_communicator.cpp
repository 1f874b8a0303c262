#include "runtime/mpi_communicator.h"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/watchdog.h"
#include "profile/cupti_collector.h"

namespace mgbench::runtime {
namespace {

/// The dtype MPI moves and reduces a tensor of `type` in: float16 and bfloat16 as float32 (MPI has
/// no such types), the others as they are.
torch::ScalarType mpi_scalar_type(torch::ScalarType type) {
  return type == torch::kHalf || type == torch::kBFloat16 ? torch::kFloat32 : type;
}

/// t's values on the host in t's dtype: t itself, or a copy of a CUDA tensor (on the caller's thread
/// and stream, at launch).
torch::Tensor on_host(const torch::Tensor& t) { return t.device().is_cpu() ? t : t.to(torch::kCPU); }

/// What one collective reads and writes, on the host: the caller's own tensors where they are on the
/// host (of any dtype), else host copies of CUDA tensors (the output's written back into it on the
/// caller's thread when the collective completes). Both are [blocks, block]: one block of `block`
/// elements per rank where MPI's buffer holds one per rank (an all-gather's output, a
/// reduce-scatter's input), else one block.
struct HostBuffers {
  torch::Tensor output;  // the caller's
  torch::Tensor out;     // where the result goes, [blocks, block]: output itself or its host copy
  torch::Tensor in;      // what MPI reads, [blocks, block]; undefined: in place (the input is in out)
  bool copy_back() const { return out.defined() && out.data_ptr() != output.data_ptr(); }
};

/// Buffers of an in-place collective (the input is the output's current values).
HostBuffers in_place(torch::Tensor& output, std::int64_t blocks) {
  return {output, on_host(output).view({blocks, -1}), {}};
}

/// Buffers of an out-of-place collective; MPI writes out without reading it.
HostBuffers out_of_place(const torch::Tensor& input, std::int64_t in_blocks, torch::Tensor& output,
                         std::int64_t out_blocks) {
  const torch::Tensor out =
      output.device().is_cpu() ? output : torch::empty(output.sizes(), output.options().device(torch::kCPU));
  return {output, out.view({out_blocks, -1}), on_host(input).view({in_blocks, -1})};
}

/// Starts the non-blocking MPI call on one segment of a collective (MPI_IN_PLACE as send for an
/// in-place one, count elements of type a rank's block); its return code.
using SegmentCall = std::function<int(const void* send, void* recv, int count, MPI_Datatype type, MPI_Request*)>;

/// One queued collective, shared by its Work and the communication thread.
struct Operation {
  const char* what = "";
  SegmentCall start;
  HostBuffers buffers;
  double launched_s = 0;  // queued (the caller's launch)
  double done_s = 0;      // the MPI call returned
  int rc = MPI_SUCCESS;
  bool done = false;  // guarded by the worker's mutex
};

/// Host memory MPI reads or writes for one segment: a piece of the caller's buffer where that is
/// contiguous and of an MPI type, else the worker's staging buffer.
class SegmentBuffer {
 public:
  /// [blocks, len] of `type` in this buffer's memory (grown as needed, kept for the next segment).
  torch::Tensor stage(std::int64_t blocks, std::int64_t len, torch::ScalarType type) {
    const std::size_t bytes = static_cast<std::size_t>(blocks * len) * c10::elementSize(type);
    if (memory_.size() * sizeof(double) < bytes) memory_.resize((bytes + sizeof(double) - 1) / sizeof(double));
    return torch::from_blob(memory_.data(), {blocks, len}, torch::TensorOptions().dtype(type));
  }

 private:
  std::vector<double> memory_;  // aligned for every MPI type
};

}  // namespace

struct MpiCommunicator::Worker {
  static constexpr int kPollIntervalUs = 50;  // the longest pause between two MPI_Test calls
  static constexpr double kSpinS = 20e-6;     // tested back to back first
  /// The most bytes one MPI call moves from or to a rank's buffer: a larger collective runs as a
  /// sequence of calls over pieces of every rank's block, so staging (bf16 / fp16 as fp32, pieces
  /// strided in the caller's buffer) and Open MPI's own temporaries (libnbc's reduce-scatter keeps
  /// about twice its input) stay this size, not the tensor's.
  static constexpr std::int64_t kSegmentBytes = std::int64_t{8} << 20;
  double timeout_s = 0;       // 0: none
  std::uint64_t started = 0;  // collectives started, for the message
  std::mutex mutex;
  std::condition_variable wake;   // the thread: work queued or stop
  std::condition_variable ended;  // waiters: an operation is done
  std::deque<std::shared_ptr<Operation>> queue;
  bool stop = false;
  SegmentBuffer send_stage, recv_stage;  // the thread's own
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

  std::shared_ptr<Operation> submit(const char* what, HostBuffers buffers, SegmentCall start) {
    auto op = std::make_shared<Operation>();
    op->what = what;
    op->buffers = std::move(buffers);
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
  /// Runs the operation as MPI calls over pieces of kSegmentBytes at most (one call for a smaller
  /// one), each driven to completion: see wait_for.
  int drive(Operation& op) {
    ++started;
    // Past timeout_s (a peer died, hangs or is stopped) the watchdog names the collective and
    // where every rank is, and ends the job.
    const watchdog::Deadline deadline(fmt::format("{} #{}", op.what, started), timeout_s);
    const HostBuffers& b = op.buffers;
    if (!b.out.defined()) {  // a barrier
      return wait_for([&](MPI_Request* r) { return op.start(nullptr, nullptr, 0, MPI_BYTE, r); });
    }
    const torch::ScalarType type = mpi_scalar_type(b.out.scalar_type());
    const std::int64_t block = b.out.size(1);
    const std::int64_t blocks = std::max(b.out.size(0), b.in.defined() ? b.in.size(0) : 1);
    const auto element = static_cast<std::int64_t>(c10::elementSize(type));
    const std::int64_t step = std::max<std::int64_t>(1, kSegmentBytes / (blocks * element));
    int rc = MPI_SUCCESS;
    for (std::int64_t first = 0; rc == MPI_SUCCESS && (first == 0 || first < block); first += step) {
      rc = run_segment(op, first, std::min(step, block - first), type);
    }
    return rc;
  }

  /// Columns [first, first + len) of every block: MPI reads and writes the caller's memory where
  /// that piece is contiguous and of `type`, else the staging buffers, converted on the way in and
  /// out. An input that shares memory with the output (NCCL's in-place reduce-scatter: the output is
  /// one of its blocks; MPI's in-place layout is another) is read from a staged copy.
  int run_segment(Operation& op, std::int64_t first, std::int64_t len, torch::ScalarType type) {
    const HostBuffers& b = op.buffers;
    const auto is_mpi_buffer = [&](const torch::Tensor& t) { return t.scalar_type() == type && t.is_contiguous(); };
    torch::Tensor out = b.out.narrow(1, first, len);
    const bool out_direct = is_mpi_buffer(out);
    const torch::Tensor recv = out_direct ? out : recv_stage.stage(out.size(0), len, type);
    const void* send = MPI_IN_PLACE;
    if (!b.in.defined()) {
      if (!out_direct) recv.copy_(out);  // in place: the input is out's values
    } else {
      const torch::Tensor in = b.in.narrow(1, first, len);
      if (is_mpi_buffer(in) && !b.in.is_alias_of(b.out)) {
        send = in.data_ptr();
      } else {
        const torch::Tensor staged = send_stage.stage(in.size(0), len, type);
        staged.copy_(in);
        send = staged.data_ptr();
      }
    }
    const int count = static_cast<int>(len);  // at most kSegmentBytes / element
    const int rc =
        wait_for([&](MPI_Request* r) { return op.start(send, recv.data_ptr(), count, mpi_datatype(type), r); });
    if (rc == MPI_SUCCESS && !out_direct) out.copy_(recv);
    return rc;
  }

  /// Starts one non-blocking MPI call and drives MPI's progress until it completes. Each MPI_Test
  /// may advance a step of the non-blocking collective's schedule, so the first kSpinS are tested
  /// back to back (a small collective completes in microseconds); then the pauses between tests
  /// double from 1 us to kPollIntervalUs, so a long collective does not take a core from backward's
  /// compute (a blocking MPI call spins; with a rank per core that slowed training by 10-15 % here).
  /// The thread's timer slack is 1 us (run()), else every pause would last Linux's default 50 us.
  static int wait_for(const std::function<int(MPI_Request*)>& start) {
    const double begin = now_s();
    MPI_Request request = MPI_REQUEST_NULL;
    int rc = start(&request);
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
    const torch::NoGradGuard no_grad;           // the staging copies record no graph (grad mode is per thread)
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
  /// On the caller's thread: the error, or a CUDA output's host copy written back.
  void complete() {
    finished_ = true;
    if (op_->rc != MPI_SUCCESS) detail::throw_mpi_error(op_->rc, op_->what, __FILE__, __LINE__);
    HostBuffers& b = op_->buffers;
    if (b.copy_back()) {
      const profile::CopyScope staging(profile::CopyPurpose::kCollectiveStaging);
      b.output.copy_(b.out.view(b.output.sizes()));
    }
    // MPI is done with the buffers: the host copies of CUDA tensors and the references to the
    // caller's tensors go now, not when the Work does (FSDP keeps its Works, for their seconds, to
    // the end of the step).
    b = {};
  }

  MpiCommunicator::Worker& worker_;
  std::shared_ptr<Operation> op_;
  bool finished_ = false;
};

/// Queues a collective to the worker.
std::unique_ptr<Work> queue(MpiCommunicator::Worker& worker, const char* what, HostBuffers buffers, SegmentCall start) {
  return std::make_unique<MpiWork>(worker, worker.submit(what, std::move(buffers), std::move(start)));
}

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

/// check_collective, and a dtype MPI can move (on the caller's thread, before anything is queued).
void require_pair(const torch::Tensor& input, const torch::Tensor& output, const char* op, std::int64_t output_factor,
                  std::int64_t input_factor) {
  check_collective(input, output, "MPI", op, output_factor, input_factor);
  mpi_datatype(mpi_scalar_type(output.scalar_type()));
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
  const MPI_Op mpi = mpi_op(op);
  MPI_Comm comm = comm_;
  return queue(*worker_, "MPI_Iallreduce",
               input.data_ptr() == output.data_ptr() ? in_place(output, 1) : out_of_place(input, 1, output, 1),
               [=](const void* send, void* recv, int count, MPI_Datatype type, MPI_Request* r) {
                 return MPI_Iallreduce(send, recv, count, type, mpi, comm, r);
               });
}

std::unique_ptr<Work> MpiCommunicator::broadcast(const torch::Tensor& input, torch::Tensor& output, int root) {
  require_pair(input, output, "broadcast", 1, 1);
  // MPI's broadcast is in place: out of place, root's input is first copied into the output.
  if (rank_ == root && input.data_ptr() != output.data_ptr()) output.copy_(input);
  MPI_Comm comm = comm_;
  return queue(*worker_, "MPI_Ibcast", in_place(output, 1),
               [=](const void* /*send*/, void* data, int count, MPI_Datatype type, MPI_Request* r) {
                 return MPI_Ibcast(data, count, type, root, comm, r);
               });
}

std::unique_ptr<Work> MpiCommunicator::all_gather(const torch::Tensor& input, torch::Tensor& output) {
  require_pair(input, output, "all_gather", world_size_, 1);
  // NCCL's in-place layout (the input is the rank's block of the output) is MPI's MPI_IN_PLACE.
  MPI_Comm comm = comm_;
  return queue(*worker_, "MPI_Iallgather",
               starts_at(input, output, rank_ * input.numel()) ? in_place(output, world_size_)
                                                               : out_of_place(input, 1, output, world_size_),
               [=](const void* send, void* recv, int count, MPI_Datatype type, MPI_Request* r) {
                 return MPI_Iallgather(send, count, type, recv, count, type, comm, r);
               });
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter(const torch::Tensor& input, torch::Tensor& output, ReduceOp op) {
  require_pair(input, output, "reduce_scatter", 1, world_size_);
  // MPI's in-place reduce-scatter has another layout than NCCL's (its result starts the buffer):
  // NCCL's in-place case runs out of place, each segment's input read from a copy (run_segment).
  const MPI_Op mpi = mpi_op(op);
  MPI_Comm comm = comm_;
  return queue(*worker_, "MPI_Ireduce_scatter_block", out_of_place(input, world_size_, output, 1),
               [=](const void* send, void* recv, int count, MPI_Datatype type, MPI_Request* r) {
                 return MPI_Ireduce_scatter_block(send, recv, count, type, mpi, comm, r);
               });
}

void MpiCommunicator::barrier() {
  MPI_Comm comm = comm_;
  queue(*worker_, "MPI_Ibarrier", {}, [=](const void*, void*, int, MPI_Datatype, MPI_Request* r) {
    return MPI_Ibarrier(comm, r);
  })->wait();
}

}  // namespace mgbench::runtime
