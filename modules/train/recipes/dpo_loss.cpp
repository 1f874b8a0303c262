#include "train/recipes/dpo_loss.h"

#include <stdexcept>

namespace mgbench::train {

DpoLoss dpo_loss(const PairLogProbs& policy, const PairLogProbs& reference, double beta, double label_smoothing) {
  const torch::Tensor& policy_chosen = policy.chosen;
  const torch::Tensor& policy_rejected = policy.rejected;
  const torch::Tensor& reference_chosen = reference.chosen;
  const torch::Tensor& reference_rejected = reference.rejected;
  for (const auto* t : {&policy_rejected, &reference_chosen, &reference_rejected}) {
    if (t->sizes() != policy_chosen.sizes() || policy_chosen.dim() != 1) {
      throw std::invalid_argument("dpo_loss: expected four [B] tensors");
    }
  }
  const torch::Tensor z = (policy_chosen - policy_rejected) - (reference_chosen - reference_rejected);
  namespace F = torch::nn::functional;
  const torch::Tensor losses =
      -F::logsigmoid(beta * z) * (1 - label_smoothing) - F::logsigmoid(-beta * z) * label_smoothing;
  return {losses, beta * (policy_chosen - reference_chosen).detach(),
          beta * (policy_rejected - reference_rejected).detach()};
}

}  // namespace mgbench::train
