#pragma once
// The update that ends a training step (step.h): the gradients summed by backward normalised as the
// recipe's LossNormalization says, clipped, and the optimizer step (GradScaler's with amp-fp16),
// without a host sync where the optimizer can skip on a device flag (FusedAdamW).
#include <cstdint>
#include <optional>

#include <torch/torch.h>

#include "train/loop_state.h"

namespace mgbench::train {

/// The factor that makes the gradients summed by backward the step's (after the GradSync's mean
/// over the ranks): where the host knows it, `value`; where only the device does (a summed loss on
/// more than one rank: the ranks' targets summed there, so that the host does not wait for the
/// step's backward to read them; TorchTune's recipes scale by a device tensor alike), `factor` and
/// `empty`.
struct GradientScale {
  double value = 1.0;    // 1 / micro-batches (a mean loss), 1 / targets (a summed loss on one rank)
  torch::Tensor factor;  // float64 [] on the device: world size / the step's targets on all ranks
  torch::Tensor empty;   // float32 [] on the device: 1 where no rank had a target (no update), else 0

  static GradientScale on_host(double value) {
    GradientScale scale;
    scale.value = value;
    return scale;
  }
};

/// The step's scale from this rank's `normalizer` (the targets its loss was summed over) and its
/// micro-batches: 1 / micro-batches for a mean loss; for a summed one 1 / normalizer on one rank,
/// nullopt where that is 0 (every label of the step masked: nothing to learn from), and on more
/// than one rank world size / the normalisers' sum, all-reduced on the device (NCCL: the stream
/// waits, not the host) and never read by the host. Throws what the communicator throws.
std::optional<GradientScale> gradient_scale(const RunSetup& setup, double normalizer, std::int64_t micro_batches);

/// The gradients scaled by `scale`, clipped (--clip-grad-norm; the shards' communicator under
/// FSDP), and the optimizer step (the GradScaler's with loss scaling). Returns the step's skip
/// flag, for the step's one host sync: a float [] tensor, 1 where the step was skipped (the
/// scaler's non-finite gradients, or no rank had a target), 0 or undefined where it stepped; a
/// FusedAdamW step skipped on it is given back (undo_step) by the caller once read.
/// - FusedAdamW without clipping: the scaling (and the loss scale's division) and the skip inside
///   its kernel: no pass over the gradients and no sync of its own, torch's fused path under
///   GradScaler. Clipping needs the true gradients first, and float64 parameters a divisor of their
///   precision (the kernel's is float32): their gradients are multiplied first, a device factor by
///   GradScaler's unscale kernel (float32 factor, the product in the gradient dtype's opmath:
///   bitwise a host Scalar's; a 0-dim device tensor in mul_ would be rounded to a bf16 gradient's
///   dtype first), in float64 for float64 gradients.
/// - SGD cannot skip on a device flag: it reads `empty` (a host sync), as GradScaler's step reads
///   its flag, before anything else, so that a step without targets leaves the scaler untouched as
///   on one rank. Under a GradScaler the fused AdamW's skipped step without targets is one without
///   an overflow to the scaler (its growth interval counts it; on one rank it is not counted).
torch::Tensor optimizer_update(const RunSetup& setup, TrainingState& training, const GradientScale& scale);

}  // namespace mgbench::train
