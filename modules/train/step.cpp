#include "train/step.h"

#include <cmath>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include <ATen/CPUGeneratorImpl.h>

#include "core/log.h"
#include "runtime/grad_sync.h"
#include "train/optim/optimizer.h"
#include "train/precision.h"
#include "train/update.h"

namespace mgbench::train {
namespace {

/// A copy of the default CPU generator, and the generator set back to one, each under its lock
/// (the loader thread may draw from it).
at::Generator cpu_generator_state() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.clone();
}
void restore_cpu_generator(const at::Generator& state) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state.get_state());
}

/// The loss and metrics of a step's micro-batches, kept on the device until the step's one sync.
struct DeviceSums {
  torch::Tensor loss;        // float64 [1]
  torch::Tensor metrics;     // float64 [metrics]
  torch::Tensor loss_scale;  // amp-fp16: the step's loss scale, float32 []
};

/// One optimizer step in its phases, as train_step runs them: the micro-batches' forward and
/// backward, the gradients' normalisation, the optimizer, and the step's one host sync.
class OptimizerStep {
 public:
  OptimizerStep(const RunSetup& setup, TrainingState& training, PhaseClock& clock)
      : setup_(setup),
        training_(training),
        clock_(clock),
        checked_(setup.device.is_cpu() && !training.scaler) {}  // amp-fp16 skips non-finite steps itself

  /// Forward and backward of one micro-batch (its tensors on the device; with --cuda-graphs, its
  /// shape's graph); `last`: the step's last, whose backward the gradient all-reduce overlaps. On the
  /// CPU a non-finite loss stops it after the forward, with the outcome's divergence set.
  void forward_backward(const data::Batch& input, bool last);
  /// The step's gradient scale (train::gradient_scale, update.h). Waiting for the gradient buckets
  /// is the allreduce phase (what the all-reduce window covers, nothing else), the normaliser's
  /// sum over the ranks the loss_reduce phase.
  std::optional<GradientScale> gradient_scale();
  /// On the CPU: whether the gradients summed over the ranks are finite, read before the update
  /// (one pass over them, GradScaler's check; no device to wait for). Where they are not, the
  /// outcome's divergence is set from the step's last micro-batch run again (diagnose_gradients)
  /// and its loss read back; the update is not taken.
  bool gradients_finite();
  /// This rank's loss per target (per sample for a mean loss), the recipe's metrics and the loss
  /// scale read back (the step's one host sync) into the outcome, with the phases and collectives.
  /// updated: whether optimizer_update ran (its skip flag, `skipped`, says whether it stepped).
  void read_back(bool updated, const torch::Tensor& skipped);

  StepOutcome& outcome() { return out_; }

 private:
  /// input's loss under the precision's autocast.
  MicroBatchLoss forward(const data::Batch& input) const;
  /// loss's backward -- the backward phase entered first where `timed` (not inside a capture), the
  /// loss scaled under amp-fp16, DDP's all-reduce armed for the `last` micro-batch, FSDP's
  /// reduce-scatters finished -- and loss with its loss and metrics detached.
  MicroBatchLoss backward(MicroBatchLoss loss, bool last, bool timed);
  /// Where input's non-finite loss came from, the weights as its forward had them: the batch and
  /// the parameters checked, then the forward run again under first_non_finite_op (not under
  /// FSDP: its all-gathers would wait for ranks that have gone on to their backward).
  /// rng: the CPU generator as that forward found it (its dropout drawn again alike).
  DivergenceFacts diagnose(const data::Batch& input, const at::Generator& rng) const;
  /// Where the step's non-finite gradients came from: the first such gradient named, then the last
  /// micro-batch's forward and backward run again under first_non_finite_op, the weights as they
  /// had them (not under FSDP: its collectives need every rank). The backward is
  /// torch::autograd::grad: it accumulates no gradient and fires no all-reduce hook (those run
  /// after AccumulateGrad), so this rank alone runs it.
  DivergenceFacts diagnose_gradients() const;
  /// The model's named parameters and buffers, as the divergence messages name the tensors ops read.
  NamedTensors named_tensors() const;
  /// Under FSDP: this rank's shards of the trained tensors, named by index (gradients: their .grad()).
  NamedTensors trained_shards(bool gradients) const;
  /// input's forward run again under first_non_finite_op, the CPU generator set back to rng (its
  /// dropout drawn alike): the op found, and the loss, with its graph where `graph` (for a
  /// backward), without one otherwise (one graph's activations at a time).
  std::pair<std::optional<NonFiniteOrigin>, torch::Tensor> rerun_forward(const data::Batch& input,
                                                                         const at::Generator& rng, bool graph) const;

  const RunSetup& setup_;
  TrainingState& training_;
  PhaseClock& clock_;
  DeviceSums sums_;
  StepOutcome out_;
  const bool checked_;  // the CPU without a GradScaler: losses and gradients checked as they come
  /// checked_: the last micro-batch and the CPU generator its forward found, for diagnose_gradients.
  std::optional<data::Batch> last_input_;
  at::Generator last_rng_;
};

void OptimizerStep::forward_backward(const data::Batch& input, bool last) {
  // The scale this step uses, read with the loss (no host sync between forward and backward).
  if (out_.micro_batches == 0 && training_.scaler) sums_.loss_scale = training_.scaler->scale_tensor();
  clock_.enter(results::Phase::kForward);
  MicroBatchLoss loss;
  if (training_.graphs) {
    // A replay's forward and backward are one launch: its time is the forward phase's.
    loss = training_.graphs->run(
        input, [&](const data::Batch& b, bool capturing) { return backward(forward(b), last, !capturing); });
  } else {
    const at::Generator rng = checked_ ? cpu_generator_state() : at::Generator();
    loss = forward(input);
    if (checked_) {
      last_input_ = input;
      last_rng_ = rng;
      const double value = loss.loss.item<double>();  // computed already: no device to wait for
      if (!std::isfinite(value)) {
        log::warn("loss {} in this step's forward: running it again to find the op that made it", value);
        out_.normalizer += setup_.recipe.loss_normalizer(input);
        out_.record.samples += input.samples;
        out_.record.loss = value;
        out_.record.phases = clock_.take();
        loss = MicroBatchLoss{};  // its graph's activations freed before the rerun
        out_.divergence = diagnose(input, rng);
        return;
      }
    }
    loss = backward(std::move(loss), last, /*timed=*/true);
  }
  const torch::Tensor value = loss.loss.to(torch::kFloat64).reshape({1});
  sums_.loss = sums_.loss.defined() ? sums_.loss + value : value;
  if (setup_.metric_count > 0) {
    if (!loss.metrics.defined() || loss.metrics.numel() != setup_.metric_count) {
      throw std::logic_error("a recipe's forward returned other metrics than its metric_names()");
    }
    const torch::Tensor metrics = loss.metrics.to(torch::kFloat64);
    sums_.metrics = sums_.metrics.defined() ? sums_.metrics + metrics : metrics;
  }
  out_.normalizer += setup_.recipe.loss_normalizer(input);
  out_.record.samples += input.samples;
  out_.record.tokens += input.tokens;
  out_.record.padded_tokens += input.padded_tokens;
  out_.flops += setup_.recipe.flops(input);
}

MicroBatchLoss OptimizerStep::forward(const data::Batch& input) const {
  const AutocastScope autocast(setup_.precision, setup_.device.type());
  return setup_.recipe.forward(input);
}

MicroBatchLoss OptimizerStep::backward(MicroBatchLoss loss, bool last, bool timed) {
  if (timed) clock_.enter(results::Phase::kBackward);
  if (last && training_.grad_sync) training_.grad_sync->prepare();  // DDP's no_sync before the last
  const torch::Tensor root = training_.scaler ? training_.scaler->scale(loss.loss) : loss.loss;
  mark_backward(root);
  root.backward();
  // The units' reduce-scatters of this micro-batch, all resharded.
  if (FullyShardedUnits* fsdp = training_.fsdp()) fsdp->finish_backward();
  loss.loss = loss.loss.detach();
  if (loss.metrics.defined()) loss.metrics = loss.metrics.detach();
  return loss;
}

std::optional<GradientScale> OptimizerStep::gradient_scale() {
  if (training_.grad_sync) {
    clock_.enter(results::Phase::kAllreduce);
    training_.grad_sync->finish();
  }
  if (setup_.recipe.loss_normalization() != LossNormalization::kMeanPerMicroBatch) {
    clock_.enter(results::Phase::kLossReduce);
  }
  return train::gradient_scale(setup_, out_.normalizer, out_.micro_batches);
}

DivergenceFacts OptimizerStep::diagnose(const data::Batch& input, const at::Generator& rng) const {
  DivergenceFacts facts;
  NamedTensors batch;
  for (std::size_t k = 0; k < input.tensors.size(); ++k) {
    const torch::Tensor& t = input.tensors[k];
    batch.emplace_back(fmt::format("tensor {} {}", k, dtype_and_shape(t)), t);
  }
  facts.non_finite_input = first_non_finite(batch);
  if (!facts.non_finite_input.empty()) return facts;
  if (training_.fsdp() != nullptr) {  // the model's tensors hold values only while their unit is gathered
    facts.non_finite_parameter = first_non_finite(trained_shards(/*gradients=*/false));
    if (facts.non_finite_parameter.empty()) {
      facts.not_rerun = "under --sharding fsdp the forward is not run again: its all-gathers need every rank";
    }
    return facts;
  }
  NamedTensors trained, frozen, buffers;
  for (const auto& p : setup_.recipe.model().named_parameters()) {
    (p.value().requires_grad() ? trained : frozen).emplace_back(p.key(), p.value());
  }
  for (const auto& b : setup_.recipe.model().named_buffers()) buffers.emplace_back(b.key(), b.value());
  for (const NamedTensors* group : {&frozen, &trained}) {
    const std::string name = first_non_finite(*group);
    if (name.empty()) continue;
    facts.non_finite_parameter = "parameter " + name;
    facts.parameter_trained = group == &trained;
    return facts;
  }
  torch::Tensor loss;
  std::tie(facts.origin, loss) = rerun_forward(input, rng, /*graph=*/false);
  facts.rerun_finite = std::isfinite(loss.item<double>());
  // A buffer the forward read (BatchNorm's running statistics, frozen): what the rerun's ops took in.
  if (!facts.origin && !facts.rerun_finite) {
    const std::string buffer = first_non_finite(buffers);
    if (!buffer.empty()) facts.non_finite_buffer = buffer;
  }
  return facts;
}

NamedTensors OptimizerStep::named_tensors() const {
  NamedTensors named;
  for (const auto& p : setup_.recipe.model().named_parameters()) named.emplace_back(p.key(), p.value());
  for (const auto& b : setup_.recipe.model().named_buffers()) named.emplace_back(b.key(), b.value());
  return named;
}

NamedTensors OptimizerStep::trained_shards(bool gradients) const {
  NamedTensors shards;
  for (std::size_t k = 0; k < training_.trainable.size(); ++k) {
    const torch::Tensor& t = training_.trainable[k];
    shards.emplace_back(fmt::format("{}this rank's shard of trained tensor {}", gradients ? "gradient of " : "", k),
                        gradients ? t.grad() : t);
  }
  return shards;
}

std::pair<std::optional<NonFiniteOrigin>, torch::Tensor> OptimizerStep::rerun_forward(const data::Batch& input,
                                                                                      const at::Generator& rng,
                                                                                      bool graph) const {
  restore_cpu_generator(rng);
  torch::Tensor loss;
  std::optional<NonFiniteOrigin> origin = first_non_finite_op(
      [&] {
        const torch::AutoGradMode grad_mode(graph);
        const AutocastScope autocast(setup_.precision, setup_.device.type());
        loss = setup_.recipe.forward(input).loss;
      },
      named_tensors());
  return {std::move(origin), loss};
}

bool OptimizerStep::gradients_finite() {
  if (!checked_) return true;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& t : training_.trainable) {
    if (t.grad().defined()) grads.push_back(t.grad());
  }
  if (grads.empty()) return true;
  // GradScaler's check (found_inf) with a divisor of 1: one op over every gradient.
  torch::Tensor found = torch::zeros({1});
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found, torch::ones({1}));
  if (found.item<float>() == 0.0F) return true;
  log::warn("non-finite gradients after this step's backward: running its last micro-batch again to find the op");
  out_.divergence = diagnose_gradients();
  read_back(/*updated=*/false, torch::Tensor());
  return false;
}

DivergenceFacts OptimizerStep::diagnose_gradients() const {
  DivergenceFacts facts;
  if (training_.fsdp() != nullptr) {
    facts.non_finite_gradient = first_non_finite(trained_shards(/*gradients=*/true));
    facts.not_rerun =
        "under --sharding fsdp the step is not run again: its all-gathers and reduce-scatters need every "
        "rank";
    return facts;
  }
  NamedTensors grads;
  std::vector<torch::Tensor> trained;
  for (const auto& p : setup_.recipe.model().named_parameters()) {
    if (!p.value().requires_grad()) continue;
    trained.push_back(p.value());
    if (p.value().grad().defined()) grads.emplace_back("gradient of " + p.key(), p.value().grad());
  }
  facts.non_finite_gradient = first_non_finite(grads);
  if (facts.non_finite_gradient.empty()) {  // a gradient outside the model's parameters (a recipe's own)
    facts.non_finite_gradient = "gradient of a trained tensor";
  }
  if (!last_input_) {
    facts.not_rerun = "no micro-batch of this step was kept";
    return facts;
  }
  torch::Tensor loss;
  std::tie(facts.origin, loss) = rerun_forward(*last_input_, last_rng_, /*graph=*/true);
  if (facts.origin) return facts;  // a forward op's non-finite values that the loss did not take up
  std::vector<torch::Tensor> rerun;
  facts.origin = first_non_finite_op(
      [&] {
        rerun = torch::autograd::grad({loss}, trained, {}, /*retain_graph=*/false, /*create_graph=*/false,
                                      /*allow_unused=*/true);
      },
      named_tensors());
  facts.origin_in_backward = facts.origin.has_value();
  NamedTensors defined;
  for (const torch::Tensor& g : rerun) {
    if (g.defined()) defined.emplace_back("rerun gradient", g);
  }
  facts.rerun_finite = std::isfinite(loss.item<double>()) && first_non_finite(defined).empty();
  return facts;
}

void OptimizerStep::read_back(bool updated, const torch::Tensor& skipped) {
  results::StepRecord& step = out_.record;
  const std::int64_t metric_count = setup_.metric_count;
  torch::Tensor on_device = metric_count > 0 ? torch::cat({sums_.loss, sums_.metrics}) : sums_.loss;
  for (const torch::Tensor& more : {sums_.loss_scale, skipped}) {
    if (more.defined()) on_device = torch::cat({on_device, more.to(sums_.loss.device(), torch::kFloat64).reshape({1})});
  }
  const torch::Tensor values = on_device.cpu();
  step.loss = out_.normalizer > 0 ? values[0].item<double>() / out_.normalizer : results::kNaN;
  std::int64_t last = values.numel() - 1;
  const bool stepped = updated && !(skipped.defined() && values[last--].item<double>() != 0.0);
  if (sums_.loss_scale.defined()) step.loss_scale = values[last].item<double>();
  if (updated && !stepped) {
    if (auto* fused = dynamic_cast<FusedAdamW*>(training_.optimizer.get())) fused->undo_step();
  }
  for (std::int64_t k = 0; k < metric_count; ++k) {
    out_.metrics.push_back(values[k + 1].item<double>() / static_cast<double>(out_.micro_batches));
  }
  step.phases = clock_.take();
  if (training_.grad_sync) step.allreduce_window_s = training_.grad_sync->window_s();
  if (FullyShardedUnits* fsdp = training_.fsdp()) {
    const CollectiveTotals c = fsdp->take_collectives();
    step.allgather_s = c.allgather_s;
    step.reducescatter_s = c.reducescatter_s;
  }
  step.skipped = stepped ? 0 : 1;
}

}  // namespace

StepOutcome train_step(const RunSetup& setup, TrainingState& training, StepSource source, double lr,
                       std::int64_t global_step) {
  OptimizerStep step(setup, training, source.clock);
  StepOutcome& out = step.outcome();
  set_learning_rate(*training.optimizer, lr);
  out.record.lr = lr;
  // A recipe whose forward changes from this step on (QAT's late switch) has its graphs captured again.
  if (setup.recipe.begin_step(global_step) && training.graphs) training.graphs->forget();
  if (training.graphs) {
    zero_gradients(*training.optimizer);
  } else {
    set_gradients_to_none(*training.optimizer);
  }

  const std::int64_t accum = setup.options.grad_accum;
  while (out.micro_batches < accum) {
    std::optional<data::Batch> batch = source.feeder.next(source.clock);
    if (!batch) break;
    ++out.loaded_batches;
    out.loaded_samples += batch->samples;
    out.skipped_images += batch->skipped_images;
    // ddp-rr: this rank loads and transfers the batch but another rank computes it; the time
    // stays on the clock and is charged to the step that follows (or, after the last, the epoch).
    if (!batch->plan.compute) continue;
    if (out.micro_batches == 0) out.record.batch_index = batch->plan.batch_index;
    if (training.shares_buffers(setup.world_size())) {
      source.clock.enter(results::Phase::kBufferBroadcast);
      runtime::broadcast_coalesced(setup.comm, training.shared_buffers, 0);
    }
    source.clock.enter(results::Phase::kTransform);
    const data::Batch input = setup.recipe.transform(std::move(*batch));
    step.forward_backward(input, out.micro_batches + 1 == accum);
    if (out.divergence) {
      ++out.micro_batches;
      return std::move(out);
    }
    if (setup.options.record_indices) {
      out.indices.insert(out.indices.end(), input.plan.indices.begin(), input.plan.indices.end());
    }
    ++out.micro_batches;
  }
  if (out.micro_batches == 0) return std::move(out);  // the epoch's plan is done
  if (out.micro_batches != accum) throw std::logic_error("an epoch plan ended inside an optimizer step");

  const std::optional<GradientScale> scale = step.gradient_scale();
  source.clock.enter(results::Phase::kOptimizer);
  if (!step.gradients_finite()) return std::move(out);
  const torch::Tensor skipped = scale.has_value() ? optimizer_update(setup, training, *scale) : torch::Tensor();
  step.read_back(scale.has_value(), skipped);
  return std::move(out);
}

}  // namespace mgbench::train
