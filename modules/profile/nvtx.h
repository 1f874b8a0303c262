#pragma once
// NVTX ranges around the training phases (data, h2d, transform, forward, backward, allreduce,
// optimizer), so a run under Nsight Systems shows mgbench's phases on its timeline.
// NVTX 3 is header-only and costs a branch when no tool is attached. Without NVTX (no CUDA
// toolkit at build time) the ranges compile to nothing.
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

}  // namespace mgbench::profile
