// The loop's work outside its training steps (loop.h): the evaluation over the recipe's
// evaluation set, copies of the trained parameters, and the exports at a run's end.
#include "train/loop.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "core/log.h"
#include "runtime/communicator.h"
#include "runtime/stop_request.h"
#include "train/device_pipeline.h"
#include "train/loop_state.h"
#include "train/precision.h"
#include "train/tensor_export.h"

namespace mgbench::train {

namespace {

/// FSDP: frees every gathered unit after work outside a step (evaluation, exports); their
/// collectives' times are not a step's. Nothing without FSDP.
void release_units(const TrainingState& training) {
  FullyShardedUnits* fsdp = training.fsdp();
  if (fsdp == nullptr) return;
  fsdp->reshard_all();
  fsdp->take_collectives();
}

/// The evaluation samples [begin, end) of this rank's contiguous shard, and the batches it runs.
struct EvalShard {
  std::int64_t begin = 0, end = 0, batches = 0;
  std::int64_t every_rank = 0;  // the batches every rank runs (the smallest shard's; under FSDP all)
};

EvalShard eval_shard(const RunSetup& setup, bool fully_sharded) {
  const std::int64_t n = setup.recipe.eval_size();
  const std::int64_t world = setup.world_size();
  const std::int64_t b = setup.options.batch_size;
  EvalShard shard{n * setup.rank() / world, n * (setup.rank() + 1) / world, 0};
  // FSDP gathers each unit in every forward, a collective: every rank runs as many batches as the
  // largest shard needs, one whose shard ends sooner a batch of one sample whose sums are dropped.
  shard.batches = fully_sharded ? ((n + world - 1) / world + b - 1) / b : (shard.end - shard.begin + b - 1) / b;
  shard.every_rank = fully_sharded ? shard.batches : (n / world + b - 1) / b;
  return shard;
}

}  // namespace

std::optional<EvalResult> TrainingLoop::evaluate(runtime::StopAgreement* stop) {
  const RunSetup& setup = state_->setup;
  const TrainingState& training = state_->training;
  Recipe& recipe = setup.recipe;
  torch::NoGradGuard no_grad;
  if (training.shares_buffers(setup.world_size())) {
    runtime::broadcast_coalesced(setup.comm, training.shared_buffers, 0);  // every rank evaluates one model
  }
  recipe.model().eval();
  const EvalShard shard = eval_shard(setup, training.fsdp() != nullptr);
  const std::int64_t n = recipe.eval_size();
  const std::int64_t b = setup.options.batch_size;
  // Summed on the device: one host sync per evaluation, not per batch. On the rank's device: the
  // NCCL backend reduces device tensors only.
  torch::Tensor sums = torch::zeros({recipe.eval_terms()}, torch::TensorOptions(torch::kFloat64).device(setup.device));
  std::int64_t k = 0;
  bool stopped = false;
  for (; k < shard.batches; ++k) {
    // Polled where every rank runs the batch (the same number of polls on every rank).
    if (stop != nullptr && k < shard.every_rank && (stopped = stop->poll())) break;
    const std::int64_t start = shard.begin + k * b;
    std::vector<std::int64_t> indices;
    for (std::int64_t i = start; i < std::min(shard.end, start + b); ++i) indices.push_back(i);
    const bool filler = indices.empty();
    if (filler) indices.push_back(std::min(shard.begin, n - 1));
    const data::Batch batch = recipe.transform(recipe.prepare_on_device(
        to_device(recipe.assemble_eval(indices), setup.device, profile::CopyPurpose::kEvalBatch)));
    const AutocastScope autocast(setup.precision, setup.device.type());
    const torch::Tensor batch_sums = recipe.eval_sums(batch);
    if (!filler) sums += batch_sums;
  }
  release_units(training);
  recipe.model().train();
  if (stopped) {
    log::info("stopped on {} after {} of {} evaluation batches: an evaluation is not continued; run it again",
              runtime::stop_signal_name(stop->agreed_signal()), k, shard.batches);
    return std::nullopt;
  }
  setup.comm.all_reduce(sums, runtime::ReduceOp::kSum)->wait();
  return recipe.eval_result(sums.cpu());
}

std::vector<torch::Tensor> TrainingLoop::trained_parameters() {
  const TrainingState& training = state_->training;
  if (FullyShardedUnits* fsdp = training.fsdp()) fsdp->gather_all();
  std::vector<torch::Tensor> copies;
  for (const auto& p : state_->setup.recipe.trainable_parameters()) copies.push_back(p.detach().clone());
  release_units(training);
  return copies;
}

void TrainingLoop::finish(int rank) {
  Recipe& recipe = state_->setup.recipe;
  write_tensor_exports(recipe.tensor_exports(), state_->training.fsdp(), rank == 0);
  recipe.finish(rank);
}

}  // namespace mgbench::train
