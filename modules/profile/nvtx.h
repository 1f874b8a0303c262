#pragma once
// NVTX ranges around the training phases (data, h2d, transform, forward, backward, allreduce,
// optimizer), so a run under Nsight Systems shows mgbench's phases on its timeline.
// NVTX 3 is header-only and costs a branch when no tool is attached. Without NVTX (no CUDA
// toolkit at build time) the ranges compile to nothing.
#include <cstdint>

namespace mgbench::profile {

/// Turns the ranges on or off for the process (--nvtx); on by default.
void set_nvtx_enabled(bool enabled);

/// Pushes a range named `name` (a string literal: it must outlive the range) on construction
/// and pops it on destruction, on the calling thread.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name);
  ~NvtxRange();
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  bool pushed_ = false;
};

/// A range that may end on another thread than the one that starts it (nvtxRangeStartA /
/// nvtxRangeEnd), for work whose end is seen elsewhere (autograd's backward). Returns its id, 0 when
/// the ranges are off or no tool is attached; nvtx_range_end(0) does nothing. `name`: a string literal.
std::uint64_t nvtx_range_start(const char* name);
void nvtx_range_end(std::uint64_t id);

}  // namespace mgbench::profile
