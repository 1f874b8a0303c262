#pragma once
// torch.optim.AdamW(fused=True) for LibTorch: the optimizer make_optimizer (optimizer.h) builds for
// --optimizer adamw, with the GradScaler-folded step the training step takes (train/step.cpp).
#include <cstdint>
#include <unordered_map>
#include <vector>

#include <torch/torch.h>

namespace mgbench::train {

/// torch.optim.AdamW(fused=True): each step one ATen kernel (at::_fused_adamw_, CPU and CUDA) per
/// device and dtype of the parameters, instead of LibTorch's AdamW's eight per-tensor ops per
/// parameter; low-precision parameters (bf16) are updated in fp32 arithmetic and rounded once, as
/// torch's fused and foreach paths do (LibTorch's per-op chain rounds after every op). The state is
/// LibTorch AdamW's (AdamWParamState: step, exp_avg, exp_avg_sq; the same save / load), so
/// checkpoints of either load into the other. Step counts live on the device as fp32 tensors
/// (torch's fused path's), kept equal to the state's step, which stays the host's count; the counts
/// of the parameters that step together are views of one tensor, advanced by one op a step (torch's
/// _foreach_add_ is one op per parameter on the CPU).
/// Throws c10::Error for a gradient whose dtype, device or shape differs from its parameter's.
class FusedAdamW final : public torch::optim::AdamW {
 public:
  using AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// One step as torch's fused AdamW takes it under a GradScaler (its grad_scale and found_inf),
  /// without a host sync: every gradient divided by grad_divisor inside the kernel (float32 [],
  /// on any device; undefined: as they are; the divided gradient stays in .grad(), as torch's), and
  /// no parameter or moment changed where found_inf (float32 [] on the parameters' device, exactly
  /// 1 or 0; undefined: 0) is 1 -- the device step counts then given back on the device. The host's
  /// counts (the state's step) advance regardless: the caller, once it has read found_inf, calls
  /// undo_step() for a skipped step.
  void step_scaled(const torch::Tensor& grad_divisor, const torch::Tensor& found_inf);
  /// The state's step counts of the last step's parameters back by one (a step_scaled that
  /// found_inf skipped; a rank whose shards had no gradient has none to give back). Throws
  /// std::logic_error when no step was taken since the last undo.
  void undo_step();

 private:
  struct DeviceStep {
    torch::Tensor value;    // fp32 [] on the parameter's device
    std::int64_t host = 0;  // what value holds
  };
  /// The device step counts of parameters that step together, in their order: [keys.size()] fp32.
  struct StepCounts {
    std::vector<const void*> keys;
    torch::Tensor counts;
  };
  /// The counts tensor of these parameters, made the first time they step together from their
  /// current counts; their device_steps_ values become its elements.
  torch::Tensor step_counts(const std::vector<const void*>& keys);
  std::vector<torch::Tensor> device_steps(const std::vector<const void*>& keys) const;
  std::unordered_map<const void*, DeviceStep> device_steps_;
  std::vector<StepCounts> step_counts_;
  std::vector<void*> last_stepped_;  // the parameters (their TensorImpl) of the last step
  bool undoable_ = false;            // a step taken since the last undo_step
};

}  // namespace mgbench::train
