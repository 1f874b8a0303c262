#include "train/op_counter.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace mgbench::train {
namespace {

// Autograd's threads run the callback too: one process-wide counter, not a thread-local one.
std::atomic<std::int64_t> counted{0};
std::atomic<bool> counting{false};

std::unique_ptr<at::ObserverContext> count_op(const at::RecordFunction& fn) {
  if (std::strncmp(fn.name(), "aten::", 6) == 0) counted.fetch_add(1, std::memory_order_relaxed);
  return nullptr;
}

}  // namespace

OpCounter::OpCounter() {
  if (counting.exchange(true)) throw std::logic_error("OpCounter: another counter is alive");
  counted.store(0);
  handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(count_op).scopes({at::RecordScope::FUNCTION}));
}

OpCounter::~OpCounter() {
  at::removeCallback(handle_);
  counting.store(false);
}

std::int64_t OpCounter::count() const { return counted.load(); }

}  // namespace mgbench::train
