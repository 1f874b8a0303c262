#include "train/cupti_window.h"

#include <cmath>
#include <string>

#include "core/log.h"
#include "core/timer.h"
#include "train/device_pipeline.h"

namespace mgbench::train {

std::unique_ptr<profile::CuptiCollector> make_cupti(const torch::Device& device, bool enabled,
                                                    const runtime::Communicator& comm) {
  if (!device.is_cuda() || !enabled) return nullptr;
  // CUPTI has one activity client: under nsys (or another injected tool) mgbench stands aside.
  if (const std::string other = profile::external_cuda_profiler(); !other.empty()) {
    if (comm.rank() == 0) {
      log::warn("--cupti: {} holds CUPTI; mgbench's CUDA metrics are off for this run (the profiler records them)",
                other);
    }
    return nullptr;
  }
  return profile::CuptiCollector::create();
}

void CuptiWindow::update(double elapsed_s, std::int64_t step, const torch::Device& device) {
  if (!cupti_) return;
  if (cupti_->running()) cupti_->end_between_steps();
  const bool inside = window_.contains(elapsed_s, step);
  if (inside && !cupti_->running() && !std::isfinite(closed_wall_s_)) {
    cupti_->start();
    opened_s_ = elapsed_s;
    opened_wall_s_ = now_s();
  } else if (!inside && cupti_->running()) {
    synchronize(device);
    cupti_->stop();
    closed_wall_s_ = now_s();
  }
}

void CuptiWindow::close(const torch::Device& device) {
  if (!cupti_ || !cupti_->running()) return;
  synchronize(device);
  cupti_->end_between_steps();
  cupti_->stop();
  closed_wall_s_ = now_s();
}

}  // namespace mgbench::train
