#pragma once
// The optimizer of the trainable parameters, as --optimizer and its options say (the learning
// rate is set by the loop at every step from the schedule, lr_schedule.h).
#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "runtime/communicator.h"
#include "train/optim/fused_adamw.h"
#include "train/optim/optim_options.h"

namespace mgbench::train {

/// sgd: torch.optim.SGD(lr, momentum, weight_decay, nesterov = momentum > 0); adamw:
/// torch.optim.AdamW(lr, weight_decay, fused=True) with PyTorch's betas and eps (fused_adamw.h;
/// TorchTune's LoRA / full configs ask fused=True too).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerOptions& options,
                                                        std::vector<torch::Tensor> params);

/// Optimizer states per trained element: AdamW's exp_avg and exp_avg_sq (2), SGD's momentum buffer
/// (1 with --momentum > 0, else 0). For memory accounting.
std::int64_t optimizer_states_per_element(const OptimizerOptions& options);

/// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

/// Drops the gradient of every parameter the optimizer trains: Python's
/// torch.optim.Optimizer.zero_grad(set_to_none=True). LibTorch's zero_grad detaches each gradient
/// in place first, which a gradient that is a view refuses (runtime::GradSync's bucket views).
void set_gradients_to_none(torch::optim::Optimizer& optimizer);
/// Zeroes every gradient the optimizer's parameters have, in place (one foreach op): Python's
/// torch.optim.Optimizer.zero_grad(set_to_none=False). The tensors stay: a CUDA graph adds into the
/// gradients it was captured with (train/step_graphs.h).
void zero_gradients(torch::optim::Optimizer& optimizer);

/// torch.nn.utils.clip_grad_norm_ (PyTorch 2.x, foreach path) without a host sync: the total L2
/// norm over the gradients of params (those without one are skipped), coef = min(max_norm /
/// (norm + 1e-6), 1), every gradient multiplied by coef in place. Returns the total norm, a
/// float [] tensor on the gradients' device (LibTorch's clip_grad_norm_ returns it as a double,
/// synchronising the host every step). sharded_over: params are this rank's shards of parameters
/// sharded over that communicator's ranks (FSDP): the norm is the whole parameters', as torch's
/// clip_grad_norm_ takes it of DTensors -- the norm of this rank's shards, squared, summed over the
/// ranks in one all-reduce on the parameters' device (float64 where a parameter is float64, float32
/// otherwise: a rank whose shards got no gradient sends a zero of its peers' dtype), its square
/// root; collective then, on every rank alike. Throws std::invalid_argument for max_norm <= 0, and
/// for sharded_over with no params (the collective's device is theirs).
torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                             runtime::Communicator* sharded_over = nullptr);

}  // namespace mgbench::train
