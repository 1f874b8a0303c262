#include "runtime/nccl_communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/config.h"
#include "core/error.h"

namespace mgbench::runtime {

std::string check_nccl_version(int linked, int built) {
  const auto text = [](int v) { return fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100); };
  MGBENCH_REQUIRE(linked / 100 == built / 100, CommError,
                  "NCCL {} is loaded but mgbench was built against NCCL {}: another libnccl.so.2 comes first (check "
                  "LD_LIBRARY_PATH and `module list`; mgbench and LibTorch must use the same NCCL)",
                  text(linked), text(built));
  if (linked != built)
    return fmt::format("NCCL {} loaded, built against {} (patch releases differ)", text(linked), text(built));
  return "";
}

}  // namespace mgbench::runtime

#if !MGBENCH_HAVE_NCCL

namespace mgbench::runtime {
bool nccl_built() { return false; }
std::string nccl_version() { return ""; }
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, int, NcclOptions) {
  throw CommError("NCCL backend: this mgbench was built without CUDA/NCCL (use --backend mpi)");
}
}  // namespace mgbench::runtime

#else

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "core/log.h"
#include "core/timer.h"
#include "core/watchdog.h"
#include "runtime/event_pool.h"
#include "runtime/nccl_calls.h"
#include "runtime/nccl_log.h"

namespace mgbench::runtime {
namespace {

/// What rank 0 broadcasts before the communicator exists.
struct Bootstrap {
  int ok = 0;
  ncclUniqueId id;
  char error[256];  // ncclGetUniqueId's error, NUL-terminated
};

using Events = EventPool<at::cuda::CUDAEvent>;

/// One collective in flight, shared by its Work and the watchdog. Its events come from the
/// communicator's pool and go back to it with the last of the two.
struct Inflight {
  std::string what;
  std::uint64_t seq = 0;
  double launched_s = 0;
  std::shared_ptr<at::cuda::CUDAEvent> start;  // timing enabled: Work::seconds_since_start_of
  std::shared_ptr<at::cuda::CUDAEvent> done;
};

class NcclWork final : public Work {
 public:
  explicit NcclWork(std::shared_ptr<Inflight> op) : op_(std::move(op)) {}
  void wait() override { op_->done->block(c10::cuda::getCurrentCUDAStream()); }
  bool test() override { return op_->done->query(); }
  double seconds_since_start_of(const Work& first) const override {
    const auto* f = dynamic_cast<const NcclWork*>(&first);
    if (f == nullptr) return 0;
    op_->done->synchronize();
    return static_cast<double>(f->op_->start->elapsed_time(*op_->done)) / 1e3;
  }

 private:
  std::shared_ptr<Inflight> op_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm mpi_comm, int device_index, NcclOptions options)
      : device_(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device_index)),
        options_(options),
        log_(nccl_log()),
        log_offset_(nccl_log_size(log_)),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device_.index())) {
    MGBENCH_CHECK_MPI(MPI_Comm_rank(mpi_comm, &rank_));
    MGBENCH_CHECK_MPI(MPI_Comm_size(mpi_comm, &world_size_));
    {
      int linked = 0;
      MGBENCH_CHECK_NCCL(ncclGetVersion(&linked));
      if (const std::string warning = check_nccl_version(linked, NCCL_VERSION_CODE); !warning.empty()) {
        log::warn("{}", warning);
      }
    }
    c10::cuda::set_device(device_.index());
    // Rank 0 sends whether it has an id, not only the id: a failed ncclGetUniqueId must fail every
    // rank together, not leave the others in the broadcast's matching collectives.
    Bootstrap boot{};
    if (rank_ == 0) {
      const ncclResult_t rc = ncclGetUniqueId(&boot.id);
      boot.ok = rc == ncclSuccess ? 1 : 0;
      if (rc != ncclSuccess) {
        fmt::format_to_n(boot.error, sizeof(boot.error) - 1, "{} ({})", ncclGetErrorString(rc),
                         ncclGetLastError(nullptr));
      }
    }
    MGBENCH_CHECK_MPI(MPI_Bcast(&boot, sizeof(boot), MPI_BYTE, 0, mpi_comm));
    MGBENCH_REQUIRE(boot.ok == 1, CommError, "NCCL: ncclGetUniqueId failed on rank 0: {}", boot.error);
    // Non-blocking communicator (NCCL >= 2.14): no NCCL call blocks; where one returns
    // ncclInProgress (creation, a collective's lazy connection, finalisation) this rank polls the
    // communicator against a deadline, so a peer that never arrives is reported, not waited for.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t rc = ncclCommInitRankConfig(&comm, world_size_, boot.id, rank_, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      throw CommError(fmt::format("NCCL: ncclCommInitRankConfig (rank {} of {}, cuda:{}) failed: {} ({})", rank_,
                                  world_size_, device_index, ncclGetErrorString(rc), ncclGetLastError(nullptr)));
    }
    comm_ = comm;
    settle(fmt::format("ncclCommInitRankConfig (rank {} of {}, cuda:{})", rank_, world_size_, device_index),
           now_s() + options_.timeout_s);
    watchdog_ = std::thread([this] { watch(); });
    int version = 0;
    ncclGetVersion(&version);
    log::debug("NCCL {} communicator: rank {} of {} on cuda:{}", version, rank_, world_size_, device_index);
  }

  /// Finalises with a deadline: ncclCommFinalize waits for every peer to finalise too, so a peer
  /// that never does would hang this rank in ncclCommDestroy forever; past options.timeout_s the
  /// communicator is aborted instead (logged; the run's results are already written).
  ~NcclCommunicator() override {
    ncclComm_t comm = comm_;
    if (comm == nullptr) return;
    try {
      // The watchdog still guards the collectives this waits for.
      stream_.synchronize();
    } catch (const std::exception& e) {
      log::error("rank {}: NCCL teardown: {}", rank_, e.what());
    }
    stop_watchdog();
    const double deadline = now_s() + options_.timeout_s;
    ncclResult_t rc = ncclCommFinalize(comm);
    ncclResult_t state = rc;
    while (state == ncclInProgress && now_s() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
    }
    if (state == ncclSuccess) {
      ncclCommDestroy(comm);
    } else {
      log::error("rank {}: ncclCommFinalize {} ({}); aborting the communicator", rank_,
                 state == ncclInProgress
                     ? fmt::format("did not complete in {:.0f} s (a peer rank did not finalise)", options_.timeout_s)
                     : fmt::format("failed: {}", ncclGetErrorString(state)),
                 ncclGetLastError(comm));
      abort_bounded(comm);
    }
    comm_ = nullptr;
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "nccl"; }

  std::string transports() const override { return nccl_log_transports(log_, log_offset_); }

  using Communicator::all_reduce;
  using Communicator::broadcast;

  std::unique_ptr<Work> all_reduce(const torch::Tensor& input, torch::Tensor& output, ReduceOp op) override {
    require_pair(input, output, "all_reduce", 1, 1);
    return launch("ncclAllReduce", input, output, [&](cudaStream_t s) {
      MGBENCH_CHECK_NCCL_ENQUEUE(ncclAllReduce(input.data_ptr(), output.data_ptr(),
                                               static_cast<std::size_t>(output.numel()),
                                               nccl_type(output.scalar_type()), nccl_op(op), comm_, s));
    });
  }

  std::unique_ptr<Work> broadcast(const torch::Tensor& input, torch::Tensor& output, int root) override {
    require_pair(input, output, "broadcast", 1, 1);
    return launch("ncclBroadcast", input, output, [&](cudaStream_t s) {
      MGBENCH_CHECK_NCCL_ENQUEUE(ncclBroadcast(input.data_ptr(), output.data_ptr(),
                                               static_cast<std::size_t>(output.numel()),
                                               nccl_type(output.scalar_type()), root, comm_, s));
    });
  }

  std::unique_ptr<Work> all_gather(const torch::Tensor& input, torch::Tensor& output) override {
    require_pair(input, output, "all_gather", world_size_, 1);
    return launch("ncclAllGather", input, output, [&](cudaStream_t s) {
      MGBENCH_CHECK_NCCL_ENQUEUE(ncclAllGather(input.data_ptr(), output.data_ptr(),
                                               static_cast<std::size_t>(input.numel()), nccl_type(output.scalar_type()),
                                               comm_, s));
    });
  }

  std::unique_ptr<Work> reduce_scatter(const torch::Tensor& input, torch::Tensor& output, ReduceOp op) override {
    require_pair(input, output, "reduce_scatter", 1, world_size_);
    return launch("ncclReduceScatter", input, output, [&](cudaStream_t s) {
      MGBENCH_CHECK_NCCL_ENQUEUE(ncclReduceScatter(input.data_ptr(), output.data_ptr(),
                                                   static_cast<std::size_t>(output.numel()),
                                                   nccl_type(output.scalar_type()), nccl_op(op), comm_, s));
    });
  }

  void barrier() override {
    torch::Tensor token = torch::zeros({1}, torch::TensorOptions().dtype(torch::kInt32).device(device_));
    all_reduce(token, ReduceOp::kSum)->wait();
    c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();  // host blocks, watchdog guards
  }

 private:
  /// check_collective, and both tensors on this rank's GPU.
  void require_pair(const torch::Tensor& input, const torch::Tensor& output, const char* op, std::int64_t output_factor,
                    std::int64_t input_factor) const {
    for (const torch::Tensor* t : {&input, &output}) {
      MGBENCH_REQUIRE(t->device() == device_, CommError, "NCCL backend {}: tensor on {}, expected {}", op,
                      t->device().str(), device_.str());
    }
    check_collective(input, output, "NCCL", op, output_factor, input_factor);
  }

  template <class Call>
  std::unique_ptr<Work> launch(const char* what, const torch::Tensor& input, const torch::Tensor& output, Call&& call) {
    auto op = std::make_shared<Inflight>();
    op->what = what;
    op->seq = ++seq_;
    op->launched_s = now_s();
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
    {
      // cudaStreamWaitEvent takes the event's state at the call: the event can be reused at once.
      const std::shared_ptr<at::cuda::CUDAEvent> ready = sync_events_.acquire();
      ready->record(current);
      ready->block(stream_);
    }
    op->start = timing_events_.acquire();
    op->done = timing_events_.acquire();
    op->start->record(stream_);
    // ncclInProgress where it cannot enqueue yet (lazy connection): settled below.
    if (!while_not_aborting([&](ncclComm_t) { call(stream_.stream()); })) wait_for_the_abort();
    settle(fmt::format("{} #{}", what, op->seq), op->launched_s + options_.timeout_s);
    op->done->record(stream_);
    // The caching allocator must not hand the tensors' memory out again before the collective
    // on the other stream is done with it.
    c10::cuda::CUDACachingAllocator::recordStream(input.storage().data_ptr(), stream_);
    if (!output.is_same(input)) c10::cuda::CUDACachingAllocator::recordStream(output.storage().data_ptr(), stream_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      inflight_.push_back(op);
    }
    return std::make_unique<NcclWork>(std::move(op));
  }

  /// Polls the communicator until no call of this rank is in progress (non-blocking mode). An
  /// asynchronous error throws CommError naming `what`; not settled by deadline_s (a peer rank died
  /// or never made the matching call) ends the job (fail).
  void settle(const std::string& what, double deadline_s) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      std::string last_error;
      const bool polled = while_not_aborting([&](ncclComm_t comm) {
        MGBENCH_CHECK_NCCL(ncclCommGetAsyncError(comm, &state));
        if (state != ncclSuccess && state != ncclInProgress) last_error = ncclGetLastError(comm);
      });
      if (!polled) wait_for_the_abort();
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        throw CommError(
            fmt::format("NCCL: {} failed: {} ({}){}", what, ncclGetErrorString(state), last_error, nccl_warnings()));
      }
      if (now_s() > deadline_s) {
        fail(fmt::format(
            "{} did not complete in {:.0f} s (--comm-timeout): a peer rank died, hangs or never made the call", what,
            options_.timeout_s));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void watch() {
    c10::cuda::set_device(device_.index());
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      if (stop_) break;
      // A sticky CUDA error makes CUDAEvent::query throw: it must end the job with its message, not
      // leave this thread through std::terminate.
      try {
        const double now = now_s();
        ncclResult_t async = ncclSuccess;
        std::string last_error;
        while_not_aborting([&](ncclComm_t comm) {
          if (ncclCommGetAsyncError(comm, &async) != ncclSuccess) async = ncclSuccess;
          if (async != ncclSuccess && async != ncclInProgress) last_error = ncclGetLastError(comm);
        });
        if (async != ncclSuccess && async != ncclInProgress) {
          fail(fmt::format("NCCL asynchronous error: {} ({})", ncclGetErrorString(async), last_error));
        }
        while (!inflight_.empty() && inflight_.front()->done->query()) inflight_.pop_front();
        if (!inflight_.empty() && now - inflight_.front()->launched_s > options_.timeout_s) {
          const auto& op = *inflight_.front();
          fail(fmt::format("{} #{} did not complete in {:.0f} s (--comm-timeout): a peer rank died or hangs", op.what,
                           op.seq, options_.timeout_s));
        }
      } catch (const std::exception& e) {
        fail(fmt::format("the NCCL watchdog stopped on an error: {}", error_message(e)));
      }
    }
  }

  /// f(comm) under calls_ unless the communicator is being aborted (then not called: false), so
  /// that no NCCL call of this rank's threads runs on the communicator while or after
  /// ncclCommAbort frees it. f must not call fail(). Throws std::logic_error where the
  /// communicator is gone (after the destructor).
  template <class F>
  bool while_not_aborting(F&& f) {
    const std::lock_guard<std::mutex> lock(*calls_);
    if (aborting_) return false;
    ncclComm_t comm = comm_;
    if (comm == nullptr) throw std::logic_error("NCCL backend: a call on a destroyed communicator");
    f(comm);
    return true;
  }

  /// "; NCCL warned: <line> | <line>" -- the last of NCCL's own warnings this communicator logged
  /// (nccl_log_warnings; its log is removed at exit) -- or "".
  std::string nccl_warnings() const {
    constexpr std::size_t kLines = 4;
    const std::vector<std::string> lines = nccl_log_warnings(log_, log_offset_, kLines);
    return lines.empty() ? std::string() : fmt::format("; NCCL warned: {}", fmt::join(lines, " | "));
  }

  /// A thread that finds the communicator being aborted waits for fail(), on another thread, to
  /// end the job (watchdog::abort_job) -- neither calling NCCL again nor going on without it.
  [[noreturn]] static void wait_for_the_abort() {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }

  /// ncclCommAbort can itself hang (NVIDIA/nccl#1013, pytorch#119250): it runs on a detached
  /// thread (once the NCCL call another thread may be making has returned: calls_) and this one
  /// waits at most kAbortWait_s for it.
  void abort_bounded(ncclComm_t comm) const {
    constexpr double kAbortWait_s = 5;  // the job still ends within --comm-timeout + 10 s
    auto done = std::make_shared<std::atomic<bool> >(false);
    std::thread([comm, done, calls = calls_] {
      const std::lock_guard<std::mutex> lock(*calls);
      ncclCommAbort(comm);
      done->store(true);
    }).detach();
    const double deadline = now_s() + kAbortWait_s;
    while (!done->load() && now_s() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!done->load())
      log::error("rank {}: ncclCommAbort did not return in {:.0f} s; going on without it", rank_, kAbortWait_s);
  }

  /// Ends the job: the reason logged, the communicator aborted (bounded), then the job
  /// (watchdog::abort_job). Once: a second caller (the watchdog and a settle timing out together)
  /// waits for the first to end the job.
  [[noreturn]] void fail(const std::string& why) {
    if (aborting_.exchange(true)) wait_for_the_abort();
    log::error("rank {}: {}{}; aborting the NCCL communicator and the job", rank_, why, nccl_warnings());
    if (ncclComm_t comm = comm_; comm != nullptr) abort_bounded(comm);
    watchdog::abort_job(1);
  }

  void stop_watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
  }

  c10::Device device_;
  NcclOptions options_;
  const NcclLog& log_;
  std::uintmax_t log_offset_ = 0;  // this communicator's lines start there (an earlier one's come before)
  int rank_ = 0;
  int world_size_ = 1;
  c10::cuda::CUDAStream stream_;
  // Before the in-flight list: destroyed after it (an event of a Work still held goes with it).
  Events timing_events_{[] { return std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault); }};
  Events sync_events_{[] { return std::make_unique<at::cuda::CUDAEvent>(cudaEventDisableTiming); }};
  std::atomic<ncclComm_t> comm_{nullptr};  // read by the watchdog
  // Held around every NCCL call on comm_ after its creation (while_not_aborting) and around its
  // abort: shared with the detached thread that aborts it.
  std::shared_ptr<std::mutex> calls_ = std::make_shared<std::mutex>();
  std::atomic<bool> aborting_{false};  // fail() has begun: no NCCL call on comm_ any more
  std::uint64_t seq_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Inflight> > inflight_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace

bool nccl_built() { return true; }

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess || v <= 0) return "";
  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9 (major * 1000 + ... before).
  return v >= 10000 ? fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
                    : fmt::format("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100);
}

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, int device_index, NcclOptions options) {
  return std::make_unique<NcclCommunicator>(comm, device_index, options);
}

}  // namespace mgbench::runtime

#endif  // MGBENCH_HAVE_NCCL
