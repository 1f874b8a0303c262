#pragma once
// BatchLoader: assembles a recipe's batches on a background thread, ahead of the training loop
// (the role of torch.utils.data.DataLoader with a prefetch queue and pin_memory). What a batch
// holds is the recipe's business (uint8 images and labels; token ids and loss targets); the
// loader only runs the recipe's assembly in plan order, `prefetch` batches ahead (a Prefetcher),
// and makes every tensor of a batch page-locked when asked, so that the copy to the GPU can be
// asynchronous.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/prefetcher.h"
#include "data/mnist.h"
#include "data/sampler.h"

namespace mgbench::data {

/// One batch of samples as a recipe assembled it: on the host (page-locked with pin_memory), or
/// on the device once the training loop's feeder has copied it.
struct Batch {
  PlannedBatch plan;                   // which samples (and whether this rank computes on them)
  std::vector<torch::Tensor> tensors;  // the recipe's tensors, e.g. uint8 images [B, 1, 28, 28] and int64 labels [B]
  /// Tensors that stay on the host when the batch goes to the device (what the recipe's transform
  /// reads there: JPEG bitstreams for nvJPEG, which parses them on the host). Not pinned.
  std::vector<torch::Tensor> host_tensors;
  std::vector<std::string> sample_names;  // the samples' files where the device decodes them (its messages)
  std::int64_t samples = 0;               // rows (images, sequences)
  std::int64_t tokens = 0;                // text: real (non-padding) input tokens; 0 otherwise
  std::int64_t padded_tokens = 0;         // text: rows x padded length; 0 otherwise
  std::int64_t loss_targets = 0;          // what a summed loss sums over (text: positions with a next-token target)
  std::int64_t skipped_images = 0;        // image files that could not be decoded, replaced (--skip-bad-images)
};

/// Builds the batch of plan's samples on the calling thread. pin_memory: allocate the tensors in
/// page-locked memory where that saves a copy (the loader pins whatever is not).
using AssembleBatch = std::function<Batch(const PlannedBatch& plan, bool pin_memory)>;

class BatchLoader {
 public:
  /// Starts the worker thread over plan. prefetch: batches assembled ahead (>= 1). pin_memory:
  /// every tensor of a batch page-locked (needs a CUDA build and device).
  BatchLoader(std::vector<PlannedBatch> plan, AssembleBatch assemble, int prefetch, bool pin_memory);

  /// The next batch in plan order, or nullopt at the end. Rethrows an exception of the worker
  /// (a DataError of the assembly, say) on the caller's thread, after the batches before it.
  std::optional<Batch> next() { return batches_.next(); }

 private:
  std::optional<Batch> assemble_next();

  std::vector<PlannedBatch> plan_;
  AssembleBatch assemble_;
  bool pin_memory_;
  std::size_t assembled_ = 0;
  Prefetcher<Batch> batches_;  // last: its thread reads the members above
};

/// The images [B, 1, rows, cols] (uint8) and labels [B] (int64) of dataset's samples `indices`,
/// as tensors 0 and 1 of a Batch; samples = B.
Batch assemble_mnist_batch(const MnistSplit& dataset, const std::vector<std::int64_t>& indices, bool pin_memory);

}  // namespace mgbench::data
