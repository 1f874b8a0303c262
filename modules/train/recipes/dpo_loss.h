#pragma once
// The DPO loss (Rafailov et al. 2023) as TorchTune 0.6.1's DPOLoss computes it
// (torchtune/rlhf/loss/dpo.py, after trl's DPOTrainer): with the sequences' summed log-probs under
// the policy (pi) and the reference (ref),
//   z = (pi_chosen - pi_rejected) - (ref_chosen - ref_rejected)
//   loss = -logsigmoid(beta z) (1 - label_smoothing) - logsigmoid(-beta z) label_smoothing   per pair
//   rewards = beta (pi - ref), detached, for chosen and rejected.
#include <torch/torch.h>

namespace mgbench::train {

struct DpoLoss {
  torch::Tensor losses;            // [B]
  torch::Tensor chosen_rewards;    // [B], no graph
  torch::Tensor rejected_rewards;  // [B], no graph
};

/// A model's summed log-probs of the pairs' chosen and rejected responses, each [B].
struct PairLogProbs {
  torch::Tensor chosen;
  torch::Tensor rejected;
};

/// policy and reference: four [B] float tensors on one device (TorchTune's DPOLoss.forward's
/// policy_chosen_logps, policy_rejected_logps, reference_chosen_logps, reference_rejected_logps).
/// Throws std::invalid_argument for other shapes.
DpoLoss dpo_loss(const PairLogProbs& policy, const PairLogProbs& reference, double beta, double label_smoothing);

}  // namespace mgbench::train
