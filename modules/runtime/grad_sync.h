#pragma once
// GradSync: DDP-style gradient averaging over a Communicator.
//
// Gradients are packed into buckets (buckets.h). A post-accumulate-grad hook on every parameter
// copies its gradient into the bucket's flat buffer as soon as backward has produced it (and, with
// gradient_as_bucket_view, makes param.grad() that slice of the bucket); a complete bucket is
// all-reduced at once (asynchronously) while backward goes on, buckets being launched strictly in
// bucket order so every rank issues the same sequence of collectives. finish() launches what is
// left, waits, and scales the buckets to the mean (copied back into the gradients without
// gradient_as_bucket_view). Without hooks (launch_in_backward false: a backward replayed from a
// CUDA graph runs no host code), finish() copies every gradient in and launches every bucket.
// Follows PyTorch DistributedDataParallel (torch/nn/parallel/distributed.py, c10d Reducer).
#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "runtime/buckets.h"
#include "runtime/communicator.h"

namespace mgbench::runtime {

class GradSync {
 public:
  /// params: the trainable parameters (requires_grad), in registration order. Installs hooks on
  /// them (launch_in_backward), or, without hooks and with gradient_as_bucket_view, makes their
  /// gradients the buckets' views. Throws CommError for parameters the backend cannot reduce.
  GradSync(std::vector<torch::Tensor> params, Communicator& comm, GradSyncOptions options = {});
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  /// The buckets GradSync would build for params (what the constructor uses). Throws CommError for
  /// a parameter that does not require grad.
  static std::vector<BucketAssignment> assign(const std::vector<torch::Tensor>& params, const GradSyncOptions& options);

  /// Before each backward: forget the previous step's readiness. Nothing without
  /// launch_in_backward: finish() does it then (a replayed step calls neither this nor any hook,
  /// and a capture must not release the previous step's collectives' handles).
  void prepare();
  /// After backward: all-reduce every bucket not yet launched (a parameter without gradient
  /// contributes zeros), wait for all (a stream wait with NCCL), and scale them: each param.grad()
  /// is then the mean over ranks (with gradient_as_bucket_view a view of its bucket, which
  /// LibTorch's Optimizer::zero_grad refuses to detach: train::set_gradients_to_none drops it). The time this exposes
  /// is measured by the caller's phase clock.
  void finish();
  /// The all-reduce window of the last step: seconds from the start of the first bucket's
  /// all-reduce to the end of the last one, on the backend's clock (see Work). Call after the
  /// step's results were read (with NCCL it waits for the last all-reduce on the host).
  /// The exposed part of it is the time from the end of backward to the end of finish();
  /// overlap = 1 - exposed / window.
  double window_s();

  std::size_t num_buckets() const { return buckets_.size(); }
  const std::vector<BucketAssignment>& assignment() const { return assignment_; }
  /// Buckets launched from hooks, i.e. during backward, in the last step (0 without launch_in_backward).
  std::size_t buckets_launched_in_backward() const { return launched_in_backward_; }

  /// Called by the hooks (autograd's thread): gradient of params[index] is final.
  void mark_ready(std::size_t index);

 private:
  struct Bucket {
    torch::Tensor flat;                 // contiguous buffer of all the bucket's gradients
    std::vector<std::size_t> params;    // parameter indices
    std::vector<std::int64_t> offsets;  // element offset of each parameter in flat
    std::size_t pending = 0;            // gradients still to arrive this step
    std::unique_ptr<Work> work;
  };
  void forget_step();  // prepare()'s work: no gradient ready, no bucket launched, no Work kept
  void launch_ready_in_order();
  void copy_in(std::size_t index);

  std::vector<torch::Tensor> params_;
  Communicator& comm_;
  std::vector<BucketAssignment> assignment_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // parameter index -> bucket
  std::vector<std::size_t> slot_of_;    // parameter index -> position in its bucket
  // Parameter index -> its slice of the bucket, viewed with the parameter's strides (DDP's bucket
  // views): a channels_last gradient is copied in and out as it lies, without a reordering copy.
  std::vector<torch::Tensor> views_;
  std::vector<bool> ready_;
  std::unique_ptr<Work> first_work_;  // kept after finish() for window_s()
  std::unique_ptr<Work> last_work_;
  std::size_t next_launch_ = 0;
  std::size_t launched_in_backward_ = 0;
  bool in_backward_ = false;
  bool as_bucket_view_ = false;
  bool hooked_ = true;  // launch_in_backward: hooks installed on the parameters
};

}  // namespace mgbench::runtime
