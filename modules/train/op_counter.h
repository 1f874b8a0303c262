#pragma once
// The host's work in a step, counted as torch.profiler counts it: ATen operators dispatched, nested
// ones included (aten::linear and the aten::t and aten::addmm inside it are three), through an
// at::RecordFunction callback. The loop counts one optimizer step of each run (epoch.h:
// op_counted_step) into the summary's ops_per_step; `mgbench report` divides it by the model's
// decoder layers (issue 47: how much of an LLM step is the host's dispatching).
#include <cstdint>

#include <ATen/record_function.h>

namespace mgbench::train {

/// Counts, while alive, the operators whose name starts with "aten::" that are dispatched on the
/// constructing thread and on autograd's threads running a backward started from it (they inherit
/// its RecordFunction callbacks with its thread-local state); not those of other threads (the batch
/// loader's). One counter at a time in a process (throws std::logic_error on a second). Costs one
/// callback per operator while alive: the loop counts a step that is not timed where it can.
class OpCounter {
 public:
  OpCounter();
  ~OpCounter();
  OpCounter(const OpCounter&) = delete;
  OpCounter& operator=(const OpCounter&) = delete;

  /// The operators counted so far.
  std::int64_t count() const;

 private:
  at::CallbackHandle handle_;
};

}  // namespace mgbench::train
