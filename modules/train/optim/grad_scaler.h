#pragma once
// GradScaler: dynamic loss scaling for mixed-precision (amp-fp16) training.
//
// LibTorch's C++ API has none; this one has the semantics of torch.amp.GradScaler
// (torch/amp/grad_scaler.py, PyTorch 2.x) for one optimizer:
//   scale(loss)      loss * S                                   (S starts at init_scale)
//   unscale(opt)     grads *= 1/S in place, found_inf = any grad non-finite
//                    (the fused ATen kernel _amp_foreach_non_finite_check_and_unscale_)
//   check(opt)       found_inf alone, the gradients left scaled (for an optimizer that divides by
//                    S itself and skips on found_inf: torch's fused AdamW, FusedAdamW::step_scaled)
//   step(opt)        unscale if not yet done, then opt.step() unless found_inf
//   update()         found_inf: S *= backoff_factor, streak reset; else after growth_interval
//                    finite steps in a row S *= growth_factor (ATen _amp_update_scale_)
// The scale and the streak live on the gradients' device as tensors; step() reads found_inf
// with one host sync, as PyTorch does. In DDP, unscale after the gradient all-reduce: every
// rank then sees the same gradients and takes the same decision. Under FSDP each rank holds other
// gradient shards: the non-finite check is then agreed over the ranks with one all-reduce (max),
// as torch's ShardedGradScaler (torch/distributed/fsdp/sharded_grad_scaler.py) does.
#include <cstdint>
#include <optional>

#include <torch/torch.h>

#include "runtime/communicator.h"

namespace mgbench::train {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16, PyTorch's default
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;  // finite steps in a row before the scale grows
  bool enabled = true;                  // disabled: every call is a pass-through
};

class GradScaler {
 public:
  /// comm: the ranks whose gradient shards the optimizer steps (FSDP), over which unscale() agrees
  /// on found_inf; nullptr when every rank has the same gradients (DDP after its all-reduce) or
  /// there is one rank. Not owned. Throws std::invalid_argument for growth_factor <= 1,
  /// backoff_factor outside (0, 1), growth_interval < 1 or init_scale <= 0.
  explicit GradScaler(GradScalerOptions options = {}, runtime::Communicator* comm = nullptr);

  /// loss (any floating dtype, any device) times the current scale.
  torch::Tensor scale(const torch::Tensor& loss);
  /// Divides the gradients of every parameter of optimizer by the scale, in place, and records
  /// whether any was inf or NaN (on any rank of comm: collective then). Returns that flag, float32
  /// [] on the gradients' device, 1 or 0 (undefined when disabled), without a host sync. Throws
  /// std::logic_error when called twice before update(), and std::invalid_argument for fp16
  /// gradients (the master weights must be fp32, as in PyTorch).
  torch::Tensor unscale(torch::optim::Optimizer& optimizer);
  /// unscale() without the division: only the flag (torch's GradScaler._check_inf_per_device, for
  /// an optimizer that divides by the scale itself: FusedAdamW::step_scaled). Same errors.
  torch::Tensor check(torch::optim::Optimizer& optimizer);
  /// Unscales if needed, then steps the optimizer unless a gradient was non-finite.
  /// Returns true when the optimizer stepped. Synchronises the host with the device once.
  bool step(torch::optim::Optimizer& optimizer);
  /// Adjusts the scale for the next step (see above). Throws std::logic_error without a
  /// preceding unscale()/step().
  void update();

  /// Current scale (host sync when on a GPU); init_scale before the first scale().
  double get_scale() const;
  /// A copy of the current scale, float32 [] on the device once scale() ran (on the CPU before),
  /// without a host sync: read it with the step's loss.
  torch::Tensor scale_tensor() const;
  /// Finite steps in a row since the last growth or backoff.
  std::int64_t growth_tracker() const;
  /// Restores a checkpointed state (scale value and streak).
  void load_state(double scale, std::int64_t growth_tracker);
  bool enabled() const { return options_.enabled; }

 private:
  void lazy_init(const torch::Device& device);
  /// unscale() (divide true) or check().
  torch::Tensor find_non_finite(torch::optim::Optimizer& optimizer, bool divide);

  GradScalerOptions options_;
  runtime::Communicator* comm_ = nullptr;
  torch::Tensor scale_;           // float32 [] on the device
  torch::Tensor growth_tracker_;  // int32 [] on the device
  torch::Tensor found_inf_;       // float32 [] on the device, set by unscale()
  bool unscaled_ = false;
  std::optional<std::pair<double, std::int64_t>> pending_state_;
};

}  // namespace mgbench::train
