#pragma once
// The optimizer of the trainable parameters, as --optimizer and its options say (the learning
// rate is set by the loop at every step from the schedule, lr_schedule.h).
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include <torch/torch.h>

#include "runtime/communicator.h"
#include "train/train_options.h"

namespace mgbench::train {

/// sgd: torch.optim.SGD(lr, momentum, weight_decay, nesterov = momentum > 0); adamw:
/// torch.optim.AdamW(lr, weight_decay, fused=True) with PyTorch's betas and eps (FusedAdamW below;
/// TorchTune's LoRA / full configs ask fused=True too).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainOptions& options, std::vector<torch::Tensor> params);

/// torch.optim.AdamW(fused=True): each step one ATen kernel (at::_fused_adamw_, CPU and CUDA) per
/// device and dtype of the parameters, instead of LibTorch's AdamW's eight per-tensor ops per
/// parameter; low-precision parameters (bf16) are updated in fp32 arithmetic and rounded once, as
/// torch's fused and foreach paths do (LibTorch's per-op chain rounds after every op). The state is
/// LibTorch AdamW's (AdamWParamState: step, exp_avg, exp_avg_sq; the same save / load), so
/// checkpoints of either load into the other. Step counts live on the device as fp32 tensors
/// (torch's fused path's), kept equal to the state's step, which stays the host's count.
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
  std::unordered_map<const void*, DeviceStep> device_steps_;
  std::vector<void*> last_stepped_;  // the parameters (their TensorImpl) of the last step
  bool undoable_ = false;            // a step taken since the last undo_step
};

/// Optimizer states per trained element: AdamW's exp_avg and exp_avg_sq (2), SGD's momentum buffer
/// (1 with --momentum > 0, else 0). For memory accounting.
std::int64_t optimizer_states_per_element(const TrainOptions& options);

/// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

/// torch.nn.utils.clip_grad_norm_ (PyTorch 2.x, foreach path) without a host sync: the total L2
/// norm over the gradients of params (those without one are skipped), coef = min(max_norm /
/// (norm + 1e-6), 1), every gradient multiplied by coef in place. Returns the total norm, a
/// float [] tensor on the gradients' device (LibTorch's clip_grad_norm_ returns it as a double,
/// synchronising the host every step). sharded_over: params are this rank's shards of parameters
/// sharded over that communicator's ranks (FSDP): the norm is the whole parameters', as torch's
/// clip_grad_norm_ takes it of DTensors -- the norm of this rank's shards, squared, summed over the
/// ranks in one all-reduce (float32, or float64 for float64 gradients), its square root; collective
/// then, on every rank alike. Throws std::invalid_argument for max_norm <= 0.
torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                             runtime::Communicator* sharded_over = nullptr);

}  // namespace mgbench::train
