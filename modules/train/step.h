#pragma once
// One optimizer step of the training loop (loop.h), on every rank alike: grad_accum micro-batches,
// each from the device feeder (data and h2d phases), the model's buffers broadcast from rank 0
// (DDP's broadcast_buffers: buffer_broadcast phase), the recipe's transform (transform phase),
// forward under the precision's autocast (the recipe's loss; forward phase), backward (scaled with
// amp-fp16; backward phase), the gradients' bucketed all-reduce overlapped with the last
// micro-batch's backward (GradSync; DDP's no_sync for the earlier ones; the exposed rest is the
// allreduce phase, nothing else); then a summed loss's normaliser all-reduced on the device
// (loss_reduce phase; not read by the host: the factor and a step without targets' skip go to the
// optimizer as device tensors), the gradients normalised as the recipe's LossNormalization says,
// clipped, and the optimizer step (GradScaler's with amp-fp16; optimizer phase). One host sync: the
// step's loss, metrics, loss scale and skip flag read together at its end (SGD, which cannot skip on
// a device flag, reads a step's lack of targets before its update). On the CPU (no device to wait for) each
// micro-batch's loss is also read after its forward: a non-finite one ends the step there, before
// its backward and update, with where it was made (train/divergence.h).
#include <cstdint>
#include <optional>
#include <vector>

#include "results/schema.h"
#include "train/device_pipeline.h"
#include "train/divergence.h"
#include "train/loop_state.h"

namespace mgbench::train {

/// What one step did on this rank.
struct StepOutcome {
  /// 0: the epoch's plan ended before the step (nothing else is set); else grad_accum.
  std::int64_t micro_batches = 0;
  /// The step's record: lr, batch_index, samples, tokens, padded_tokens, loss (per target: per sample
  /// for a mean loss; NaN when nothing was a target), loss_scale, phases, allreduce_window_s,
  /// skipped. Where and when it ran (epoch, step, start_s, step_s) are the loop's to fill.
  results::StepRecord record;
  std::int64_t loaded_batches = 0;  // plan entries taken, computed or not (ddp-rr loads others' batches too)
  std::int64_t loaded_samples = 0;
  std::int64_t skipped_images = 0;    // bad image files replaced in the loaded batches (--skip-bad-images)
  double normalizer = 0;              // targets the loss was summed over (1 per micro-batch for a mean loss)
  double flops = 0;                   // model FLOPs of the micro-batches' forward and backward
  std::vector<double> metrics;        // the recipe's metrics, the mean over the micro-batches
  std::vector<std::int64_t> indices;  // --record-indices: the samples computed on, in order
  /// On the CPU: where the micro-batch whose forward returned a non-finite loss got it. The step
  /// stopped after that forward (no backward, no update; record.loss is that loss).
  std::optional<DivergenceFacts> divergence;
};

/// Where a step takes its micro-batches from (the epoch's feeder) and the clock its phases are timed on.
struct StepSource {
  DeviceFeeder& feeder;
  PhaseClock& clock;
};

/// Runs one optimizer step at learning rate lr, the run's step global_step (0-based), updating
/// training (gradients, optimizer, loss scale). Throws std::logic_error when an epoch plan ends
/// inside a step or a recipe returns other metrics than it names (defects), and whatever the
/// recipe throws.
StepOutcome train_step(const RunSetup& setup, TrainingState& training, StepSource source, double lr,
                       std::int64_t global_step);

}  // namespace mgbench::train
