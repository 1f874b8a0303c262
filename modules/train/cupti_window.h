#pragma once
// CUPTI collecting while --profile-window is open, checked at step boundaries (GPU runs with
// --cupti). Times are seconds into the run (its time: RunSinks::run_time), how long the window was
// open the wall clock's (CUPTI's gaps between steps, checkpoint writes included, are on that clock).
#include <cmath>
#include <cstdint>
#include <memory>

#include <torch/torch.h>

#include "profile/cupti_collector.h"
#include "profile/profile_window.h"
#include "runtime/communicator.h"

namespace mgbench::train {

class CuptiWindow {
 public:
  void set(std::unique_ptr<profile::CuptiCollector> cupti, profile::ProfileWindow window) {
    cupti_ = std::move(cupti);
    window_ = window;
  }
  profile::CuptiCollector* collector() const { return cupti_.get(); }
  /// Whether the window holds a step that starts elapsed_s into the run, at global step `step`.
  bool contains(double elapsed_s, std::int64_t step) const { return window_.contains(elapsed_s, step); }
  /// Before global step `step`, starting elapsed_s into the run: ends the gap since the last step
  /// (step_ended), then opens or closes the window (once closed, it stays closed). No sync for the
  /// gap: what ran in it (an evaluation, a checkpoint) ended in a host sync of its own, and the
  /// feeder's copies for this step may still be in flight.
  void update(double elapsed_s, std::int64_t step, const torch::Device& device);
  /// After a step (its host sync read its values): a gap between steps begins, whose CUDA activity
  /// the collector keeps out of the steps' totals until the next update() or close().
  void step_ended() {
    if (cupti_ && cupti_->running()) cupti_->begin_between_steps();
  }
  /// At the end of the run: closes the window if still open, its last gap with it.
  void close(const torch::Device& device);
  /// Counts a step and its samples when it started inside the window (what the CUDA metrics cover).
  void count(double start_s, std::int64_t step, std::int64_t samples) {
    if (!contains(start_s, step)) return;
    samples_ += samples;
    ++steps_;
  }
  double opened_s() const { return opened_s_; }  // seconds into the run; NaN: never opened
  /// How long the window was open, on the wall clock [s]; NaN: never opened or not yet closed.
  double open_s() const { return closed_wall_s_ - opened_wall_s_; }
  std::int64_t samples() const { return samples_; }
  std::int64_t steps() const { return steps_; }

 private:
  std::unique_ptr<profile::CuptiCollector> cupti_;
  profile::ProfileWindow window_;
  double opened_s_ = NAN;
  double opened_wall_s_ = NAN;  // on now_s()'s clock
  double closed_wall_s_ = NAN;
  std::int64_t samples_ = 0;  // of this process's steps (not carried over a resume)
  std::int64_t steps_ = 0;
};

/// CUPTI's collector for a run on `device` with --cupti (`enabled`), unless another profiler (nsys)
/// holds CUPTI (then nullptr, with a warning from rank 0); nullptr on the CPU and without --cupti.
std::unique_ptr<profile::CuptiCollector> make_cupti(const torch::Device& device, bool enabled,
                                                    const runtime::Communicator& comm);

}  // namespace mgbench::train
