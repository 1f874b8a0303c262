#pragma once
// A pool of reusable events for the NCCL backend's collectives. Each collective takes the events it
// needs (the caller's-stream "ready" event, its start and completion events) and gives them back
// when its last user lets go, so a run creates a handful of events instead of three per collective:
// cudaEventCreate / cudaEventDestroy are driver calls that take the context's lock, on the host
// path of every bucket launched during backward. Follows PyTorch's ProcessGroupNCCL, which keeps a
// CUDAEventCache for the same reason.
//
// Header-only and free of CUDA (Event is any type, made by the pool's factory), so its logic is
// tested on CPU (tests/unit/test_gpu_path_cpu.cpp).
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace mgbench::runtime {

template <class Event>
class EventPool {
 public:
  using Factory = std::function<std::unique_ptr<Event>()>;

  /// `make` creates an event when none is idle; it may throw (acquire passes it on).
  explicit EventPool(Factory make) : state_(std::make_shared<State>()) { state_->make = std::move(make); }

  /// An idle event, or a new one from the factory. It goes back to the pool when the last
  /// shared_ptr to it is released, on any thread; if the pool is gone by then, it is destroyed.
  /// A recycled event still holds its previous record: record it before waiting on it.
  std::shared_ptr<Event> acquire() {
    std::unique_ptr<Event> event;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (!state_->idle.empty()) {
        event = std::move(state_->idle.back());
        state_->idle.pop_back();
      }
    }
    if (event == nullptr) {
      event = state_->make();
      std::lock_guard<std::mutex> lock(state_->mutex);
      ++state_->created;
      state_->idle.reserve(state_->created);  // so that giving it back never allocates
    }
    std::weak_ptr<State> home = state_;
    return std::shared_ptr<Event>(event.release(), [home](Event* e) {
      std::unique_ptr<Event> owned(e);
      if (const auto state = home.lock()) {
        std::lock_guard<std::mutex> lock(state->mutex);
        state->idle.push_back(std::move(owned));
      }
    });
  }

  /// Events the factory has made so far (in use + idle).
  std::size_t created() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->created;
  }
  /// Events waiting in the pool.
  std::size_t idle() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->idle.size();
  }

 private:
  struct State {
    mutable std::mutex mutex;
    std::vector<std::unique_ptr<Event> > idle;
    std::size_t created = 0;
    Factory make;
  };
  std::shared_ptr<State> state_;  // shared with the events out on loan
};

}  // namespace mgbench::runtime
