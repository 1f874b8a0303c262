#include "data/loader.h"

#include <algorithm>
#include <cstring>

namespace mgbench::data {

Batch assemble_mnist_batch(const MnistSplit& dataset, const std::vector<std::int64_t>& indices, bool pin_memory) {
  const auto b = static_cast<std::int64_t>(indices.size());
  const auto options = torch::TensorOptions().pinned_memory(pin_memory);
  torch::Tensor images = torch::empty({b, 1, dataset.rows, dataset.cols}, options.dtype(torch::kUInt8));
  torch::Tensor labels = torch::empty({b}, options.dtype(torch::kInt64));
  auto* image_data = images.data_ptr<std::uint8_t>();
  auto* label_data = labels.data_ptr<std::int64_t>();
  const auto bytes = static_cast<std::size_t>(dataset.image_bytes());
  for (std::int64_t k = 0; k < b; ++k) {
    const auto i = static_cast<std::size_t>(indices[static_cast<std::size_t>(k)]);
    std::memcpy(image_data + static_cast<std::size_t>(k) * bytes, dataset.images.data() + i * bytes, bytes);
    label_data[k] = dataset.labels[i];
  }
  Batch batch;
  batch.plan.indices = indices;
  batch.tensors = {std::move(images), std::move(labels)};
  batch.samples = b;
  return batch;
}

BatchLoader::BatchLoader(std::vector<PlannedBatch> plan, AssembleBatch assemble, int prefetch, bool pin_memory)
    : plan_(std::move(plan)),
      assemble_(std::move(assemble)),
      pin_memory_(pin_memory),
      batches_([this] { return assemble_next(); }, static_cast<std::size_t>(std::max(prefetch, 1))) {}

std::optional<Batch> BatchLoader::assemble_next() {
  if (assembled_ == plan_.size()) return std::nullopt;
  PlannedBatch& planned = plan_[assembled_++];
  Batch batch = assemble_(planned, pin_memory_);
  if (pin_memory_) {
    for (auto& t : batch.tensors) {
      if (!t.is_pinned()) t = t.pin_memory();
    }
  }
  batch.plan = std::move(planned);
  return batch;
}

}  // namespace mgbench::data
