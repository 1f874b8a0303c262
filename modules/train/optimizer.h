#pragma once
// The optimizer of the trainable parameters, as --optimizer and its options say (the learning
// rate is set by the loop at every step from the schedule, lr_schedule.h).
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "train/train_options.h"

namespace mgbench::train {

/// sgd: torch.optim.SGD(lr, momentum, weight_decay, nesterov = momentum > 0); adamw:
/// torch.optim.AdamW(lr, weight_decay) with PyTorch's betas and eps.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainOptions& options, std::vector<torch::Tensor> params);

/// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace mgbench::train
