#pragma once
// Assignment of gradients to all-reduce buckets, as PyTorch DDP does it
// (torch/csrc/distributed/c10d/reducer.cpp, compute_bucket_assignment_by_size): parameters in
// reverse registration order (the order backward produces their gradients), one bucket list per
// dtype, a bucket closed once it holds at least its byte limit; the first bucket of each dtype
// has a small limit (DDP: 1 MiB) so communication starts early in backward.
// Torch-free, so it is unit-tested on plain sizes.
#include <cstddef>
#include <span>
#include <vector>

namespace mgbench::runtime {

inline constexpr std::size_t kDefaultBucketBytes = 25u * 1024u * 1024u;  // DDP bucket_cap_mb = 25
inline constexpr std::size_t kDefaultFirstBucketBytes = 1024u * 1024u;   // DDP _DEFAULT_FIRST_BUCKET_BYTES

struct TensorSize {
  std::size_t bytes = 0;  // numel * element size
  int dtype = 0;          // any key; tensors of different keys never share a bucket
};

struct BucketAssignment {
  std::vector<std::size_t> tensors;  // indices into the input, in the order they fill the bucket
  std::size_t bytes = 0;
  int dtype = 0;
};

/// Buckets in the order they become ready during backward (reverse parameter order).
/// Throws std::invalid_argument when a byte limit is 0.
std::vector<BucketAssignment> assign_buckets(std::span<const TensorSize> tensors, std::size_t first_bucket_bytes,
                                             std::size_t bucket_bytes);

/// How GradSync (grad_sync.h) buckets and launches the gradients' all-reduce.
struct GradSyncOptions {
  std::size_t bucket_bytes = kDefaultBucketBytes;
  std::size_t first_bucket_bytes = kDefaultFirstBucketBytes;
  /// PyTorch DDP's gradient_as_bucket_view: each param.grad() becomes its slice of the bucket, so a
  /// gradient is held once; false (PyTorch's default): the mean is copied back into gradients of
  /// their own, held beside the buckets.
  bool gradient_as_bucket_view = false;
  /// true (DDP): hooks copy each gradient into its bucket as backward produces it and launch a
  /// bucket's all-reduce as soon as it is complete, overlapping backward. false: no hooks; finish()
  /// copies every gradient in and all-reduces every bucket after backward, nothing overlapped --
  /// for a backward replayed from a CUDA graph (train/step_graphs.h), which runs no hook. Without
  /// hooks and with gradient_as_bucket_view the gradients are the buckets' views from the start
  /// (their addresses never change: zero them in place, never set them to none).
  bool launch_in_backward = true;
};

}  // namespace mgbench::runtime
