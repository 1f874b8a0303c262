#include "data/loader.h"

#include <cstring>

namespace mgbench::data {

ImageBatch assemble_batch(const MnistSplit& dataset, const std::vector<std::int64_t>& indices, bool pin_memory) {
  const auto b = static_cast<std::int64_t>(indices.size());
  const auto options = torch::TensorOptions().pinned_memory(pin_memory);
  ImageBatch batch;
  batch.images = torch::empty({b, 1, dataset.rows, dataset.cols}, options.dtype(torch::kUInt8));
  batch.labels = torch::empty({b}, options.dtype(torch::kInt64));
  auto* images = batch.images.data_ptr<std::uint8_t>();
  auto* labels = batch.labels.data_ptr<std::int64_t>();
  const auto bytes = static_cast<std::size_t>(dataset.image_bytes());
  for (std::int64_t k = 0; k < b; ++k) {
    const auto i = static_cast<std::size_t>(indices[static_cast<std::size_t>(k)]);
    std::memcpy(images + static_cast<std::size_t>(k) * bytes, dataset.images.data() + i * bytes, bytes);
    labels[k] = dataset.labels[i];
  }
  batch.plan.indices = indices;
  return batch;
}

ImageLoader::ImageLoader(const MnistSplit& dataset, std::vector<PlannedBatch> plan, int prefetch, bool pin_memory,
                         HostTransform transform)
    : dataset_(dataset),
      plan_(std::move(plan)),
      capacity_(static_cast<std::size_t>(std::max(prefetch, 1))),
      pin_memory_(pin_memory),
      transform_(std::move(transform)),
      worker_([this] { run(); }) {}

ImageLoader::~ImageLoader() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

ImageBatch ImageLoader::assemble(PlannedBatch plan) const {
  ImageBatch batch = assemble_batch(dataset_, plan.indices, pin_memory_ && !transform_);
  if (transform_) {
    batch.images = transform_(batch.images);
    if (pin_memory_) batch.images = batch.images.pin_memory();
  }
  batch.plan = std::move(plan);
  return batch;
}

void ImageLoader::run() {
  try {
    for (auto& planned : plan_) {
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [this] { return stop_ || ready_.size() < capacity_; });
        if (stop_) return;
      }
      ImageBatch batch = assemble(std::move(planned));
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

std::optional<ImageBatch> ImageLoader::next() {
  std::unique_lock lock(mutex_);
  if (delivered_ == plan_.size()) return std::nullopt;
  cv_.wait(lock, [this] { return !ready_.empty() || error_ != nullptr; });
  if (ready_.empty() && error_) std::rethrow_exception(error_);
  ImageBatch batch = std::move(ready_.front());
  ready_.pop_front();
  ++delivered_;
  lock.unlock();
  cv_.notify_all();
  return batch;
}

}  // namespace mgbench::data
