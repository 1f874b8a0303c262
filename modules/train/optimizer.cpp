#include "train/optimizer.h"

namespace mgbench::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainOptions& o, std::vector<torch::Tensor> params) {
  switch (o.optimizer) {
    case OptimizerKind::kSgd:
      return std::make_unique<torch::optim::SGD>(
          std::move(params),
          torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay).nesterov(o.momentum > 0));
    case OptimizerKind::kAdamW:
      return std::make_unique<torch::optim::AdamW>(std::move(params),
                                                   torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
  }
  throw std::logic_error("optimizer missing from make_optimizer");
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace mgbench::train
