#pragma once
// Prefetcher<T>: runs a producer on its own thread, at most `capacity` items ahead of the consumer,
// and hands the items over in the order they were made: a bounded single-producer / single-consumer
// stage, the pattern of torch.utils.data's prefetching DataLoader and of DALI's pipeline stages.
// mgbench's input pipeline is two of them: data::BatchLoader (the recipe's host assembly, pinned)
// and train::DeviceFeeder (the copies to the GPU and the recipe's device-side preparation, nvJPEG,
// on the copy stream), so neither's host time lands on the training thread.
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace mgbench {

template <class T>
class Prefetcher {
 public:
  /// produce: the next item, or nullopt at the end. Called on the prefetcher's thread only, one call
  /// at a time, until it returns nullopt or throws, or the prefetcher is destroyed. capacity: the most
  /// items made or in the making and not yet taken (>= 1; 0 counts as 1): the producer waits for
  /// room before it starts an item. T may be move-only.
  Prefetcher(std::function<std::optional<T>()> produce, std::size_t capacity);
  /// Stops producing (the call in progress finishes; its item is dropped) and joins the thread.
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  /// The next item in production order, waiting for it; nullopt once the producer has ended. Where
  /// the producer threw, the items made before are handed over first, then every call rethrows its
  /// exception on the caller's thread.
  std::optional<T> next();

 private:
  void run();

  std::function<std::optional<T>()> produce_;
  std::size_t capacity_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<T> ready_;
  bool ended_ = false;  // the producer returned nullopt or threw
  bool stop_ = false;   // the consumer is gone
  std::exception_ptr error_;
  std::thread worker_;  // last: started once every member above exists
};

template <class T>
Prefetcher<T>::Prefetcher(std::function<std::optional<T>()> produce, std::size_t capacity)
    : produce_(std::move(produce)), capacity_(capacity == 0 ? 1 : capacity), worker_([this] { run(); }) {}

template <class T>
Prefetcher<T>::~Prefetcher() {
  {
    const std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

template <class T>
void Prefetcher<T>::run() {
  try {
    while (true) {
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [this] { return stop_ || ready_.size() < capacity_; });
        if (stop_) return;
      }
      std::optional<T> item = produce_();
      const std::lock_guard lock(mutex_);
      if (!item) {
        ended_ = true;
        break;
      }
      ready_.push_back(std::move(*item));
      cv_.notify_all();
    }
  } catch (...) {
    const std::lock_guard lock(mutex_);
    error_ = std::current_exception();
    ended_ = true;
  }
  cv_.notify_all();
}

template <class T>
std::optional<T> Prefetcher<T>::next() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [this] { return !ready_.empty() || ended_; });
  if (ready_.empty()) {
    if (error_) std::rethrow_exception(error_);
    return std::nullopt;
  }
  std::optional<T> item(std::move(ready_.front()));
  ready_.pop_front();
  lock.unlock();
  cv_.notify_all();
  return item;
}

}  // namespace mgbench
