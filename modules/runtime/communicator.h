#pragma once
// The Communicator: collectives over the ranks of a job, on tensors.
//
// Backends: MpiCommunicator (mpi_communicator.h; CPU tensors, CUDA tensors staged through host
// memory) and NcclCommunicator (nccl_communicator.h; CUDA tensors, bootstrapped over MPI), each
// created through its row of the backend table (backend.h).
// Every collective is asynchronous and returns a Work
// handle, so gradient buckets can be reduced while backward still runs:
//  - MPI: the operation is an MPI non-blocking collective; Work::wait() blocks the host.
//  - NCCL: the operation runs on the backend's own stream after an event recorded on the
//    caller's current stream; Work::wait() makes the caller's current stream wait (no host sync).
// Collectives must be issued in the same order on every rank (as in MPI and NCCL).
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

namespace mgbench::runtime {

enum class ReduceOp { kSum, kMax, kMin };

/// Handle of an asynchronous collective.
class Work {
 public:
  virtual ~Work() = default;
  /// Orders the caller after the collective (host wait for MPI, stream wait for NCCL).
  /// Throws CommError when the collective failed.
  virtual void wait() = 0;
  /// Non-blocking: true when the collective has finished. Also drives MPI progress.
  virtual bool test() = 0;
  /// Seconds from the start of `first` (an earlier collective of the same communicator) to the
  /// end of this one, on the backend's clock: CUDA events on the NCCL stream (waits for this
  /// collective on the host), the host clock for MPI (launch to completion observed by
  /// wait()/test()). Valid once this collective has been waited on. GradSync uses it for the
  /// all-reduce window of a step.
  virtual double seconds_since_start_of(const Work& first) const = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  /// "mpi" or "nccl".
  virtual std::string backend() const = 0;

  /// All-reduce: output = op over the ranks of input, elementwise. input and output are contiguous
  /// tensors of one dtype (float32, float64, float16, bfloat16, int32, int64) and size; output may
  /// be input (in place). Neither may be touched until the Work has been waited on.
  virtual std::unique_ptr<Work> all_reduce(const torch::Tensor& input, torch::Tensor& output, ReduceOp op) = 0;
  /// Broadcast: output = root's input on every rank (input is read on root only); same rules.
  virtual std::unique_ptr<Work> broadcast(const torch::Tensor& input, torch::Tensor& output, int root) = 0;
  /// All-gather: output [world_size * n] = the ranks' inputs [n], in rank order. In place when input
  /// is this rank's slice of output (output.data_ptr() + rank * n elements), as NCCL defines it.
  virtual std::unique_ptr<Work> all_gather(const torch::Tensor& input, torch::Tensor& output) = 0;
  /// Reduce-scatter: output [n] = op over the ranks of input [world_size * n], slice `rank`. In place
  /// when output is this rank's slice of input, as NCCL defines it.
  virtual std::unique_ptr<Work> reduce_scatter(const torch::Tensor& input, torch::Tensor& output, ReduceOp op) = 0;

  /// In-place all-reduce of a contiguous tensor (see above).
  std::unique_ptr<Work> all_reduce(torch::Tensor& tensor, ReduceOp op) { return all_reduce(tensor, tensor, op); }
  /// In-place broadcast of a contiguous tensor from root to every rank.
  std::unique_ptr<Work> broadcast(torch::Tensor& tensor, int root) { return broadcast(tensor, tensor, root); }
  /// Blocks until every rank has reached the barrier.
  virtual void barrier() = 0;

  /// How this rank's connections to its peers travel, as far as they are made (NCCL connects
  /// lazily, at the first collective of each algorithm): runtime::format_transports's text
  /// ("P2P/CUMEM/read x24, NET/IB/GDRDMA x8"; "none" without a connection), or a sentence beginning
  /// "unread:" saying why it cannot be known. "" for a backend that does not choose transports (MPI).
  virtual std::string transports() const { return ""; }
};

}  // namespace mgbench::runtime

namespace mgbench::runtime {

/// The rules every collective's tensors share, whatever the backend: contiguous, one dtype, and
/// output numel x input_factor == input numel x output_factor (all-gather: output_factor = world
/// size; reduce-scatter: input_factor = world size). Throws CommError "<backend> backend <op>: ...".
void check_collective(const torch::Tensor& input, const torch::Tensor& output, const char* backend, const char* op,
                      std::int64_t output_factor, std::int64_t input_factor);

/// Broadcasts tensors from root in place, one collective per dtype (tensors of a dtype are
/// packed into one flat buffer first). Used to start every rank from rank 0's parameters and
/// to share BatchNorm buffers each step (DDP's broadcast_buffers). Blocks until done.
void broadcast_coalesced(Communicator& comm, const std::vector<torch::Tensor>& tensors, int root);
/// The size [bytes] of each broadcast broadcast_coalesced issues for `tensors` at more than one
/// rank, in its order (by dtype); empty for no tensors.
std::vector<std::int64_t> broadcast_coalesced_bytes(const std::vector<torch::Tensor>& tensors);

/// Collective: the transports of every rank's connections together (Communicator::transports()
/// summed over the ranks, in its text form), the same on every rank; an "unread:" sentence when
/// any rank's cannot be read; "" for a backend without transports. `device`: where the backend's
/// collectives take tensors (the rank's device). The text is at most max_bytes - 1 bytes (a
/// fixed-size field with its NUL: results::kTransportsBytes): a longer list is cut after a whole
/// entry and ends in ", ...". Throws CommError for max_bytes < 16.
std::string gather_transports(Communicator& comm, const torch::Device& device, std::size_t max_bytes);

}  // namespace mgbench::runtime
