#include "data/loader.h"

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
      capacity_(static_cast<std::size_t>(std::max(prefetch, 1))),
      pin_memory_(pin_memory),
      worker_([this] { run(); }) {}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void BatchLoader::run() {
  try {
    for (auto& planned : plan_) {
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [this] { return stop_ || ready_.size() < capacity_; });
        if (stop_) return;
      }
      Batch batch = assemble_(planned, pin_memory_);
      if (pin_memory_) {
        for (auto& t : batch.tensors) {
          if (!t.is_pinned()) t = t.pin_memory();
        }
      }
      batch.plan = std::move(planned);
      {
        std::lock_guard lock(mutex_);
        ready_.push_back(std::move(batch));
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard lock(mutex_);
    error_ = std::current_exception();
  }
  cv_.notify_all();
}

std::optional<Batch> BatchLoader::next() {
  std::unique_lock lock(mutex_);
  if (delivered_ == plan_.size()) return std::nullopt;
  cv_.wait(lock, [this] { return !ready_.empty() || error_ != nullptr; });
  if (ready_.empty() && error_) std::rethrow_exception(error_);
  Batch batch = std::move(ready_.front());
  ready_.pop_front();
  ++delivered_;
  lock.unlock();
  cv_.notify_all();
  return batch;
}

}  // namespace mgbench::data
