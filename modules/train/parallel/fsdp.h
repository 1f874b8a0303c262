#pragma once
// Fully sharded data parallelism (--sharding fsdp): FSDP2 as torch 2.11 implements it
// (torch/distributed/fsdp/_fully_shard: _fsdp_param.py, _fsdp_param_group.py,
// _fsdp_collectives.py), called as TorchTune 0.6's distributed recipes call it (shard_model: one
// unit per decoder layer, the embedding and the output head units of their own, the root).
//
// Every parameter is sharded on dim 0 across the ranks, trainable and frozen alike: rank r keeps
// torch.chunk's chunk r of the rows, padded to chunk 0's rows (FSDP2's _chunk_with_empty and
// padding). The optimizer holds and updates the shards only. A unit's shards are all-gathered as
// one collective through a flat buffer before its forward (the next unit's gather issued while
// this one computes: FSDP2's forward prefetch), copied out into the module's own parameter
// tensors, whose storage is freed again after forward (reshard_after_forward) and after backward;
// in backward a resharded unit is gathered again before its gradients are computed (the earlier
// unit's gather prefetched, as FSDP2's backward prefetch) -- unless its backward reads no
// parameters (ParameterUnit::backward_reads_parameters: an untied embedding), which FSDP2 gathers
// anyway -- and right after them it is freed and its gradients are reduce-scattered into the
// shards' gradients, pieces of the collective's output (one reduce-scatter in flight; FSDP2's divide:
// the mean over ranks, fp16 / fp64 divided partly before the sum and partly after, as
// _get_gradient_divide_factors). Gradient accumulation as TorchTune: a reduce-scatter after every
// micro-batch's backward, summed into the shards' gradients. A unit of one evenly divided parameter
// (the head, the embedding) is gathered straight into the parameter and reduce-scattered straight
// from its gradient: its rank-major flat buffer is the parameter itself.
//
// The module's parameters keep their identity (modules, autograd and checkpoints refer to them):
// only their storage is freed and re-allocated, as FSDP2's `storage().resize_(0)`; the saved
// tensors of autograd are views of that storage and see the regathered values in backward.
//
// Frozen packed weights (QLoRA's NF4 base, models::PackedWeight) are sharded as torchao's
// NF4Tensor shards them under FSDP2 (nf4tensor.py: nf4_split, fsdp_pre_all_gather): each part --
// packed codes, block scalers, quantisation factors -- split evenly in whole quantisation blocks
// (a world size that does not divide the blocks is refused), gathered packed (~4.13 bits a weight)
// and dequantised by the layer as before. Unlike FSDP2, which gathers a unit of mixed dtypes as one
// uint8 buffer, the packed bytes go in a second all-gather issued and waited with the first.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "models/parameter_units.h"
#include "runtime/communicator.h"
#include "train/parallel/shard_layout.h"

namespace mgbench::train {

class UnitSharder;

/// FSDP's collectives completed since the last FullyShardedUnits::take_collectives().
struct CollectiveTotals {
  double allgather_s = 0;                // each from its launch to its completion, summed
  double reducescatter_s = 0;            // likewise
  std::int64_t allgather_bytes = 0;      // the gathered buffers' bytes, summed
  std::int64_t reducescatter_bytes = 0;  // the reduce-scattered inputs' bytes, summed
};

class FullyShardedUnits final : public models::UnitHooks {
 public:
  /// Shards model's units over comm's ranks (collective-free: each rank keeps its rows of its own
  /// copy, which must equal every other rank's) and installs itself as the model's hooks. Every
  /// parameter is freed to its shard. cut_at_build: the shards a UnitSharder cut while the model was
  /// built (unit_sharder.h), taken for their tensors instead of cutting them here; every one of
  /// them must belong to the model. Throws ConfigError for a packed weight whose blocks the world
  /// size does not divide (naming it, its blocks and the world size), std::logic_error for a unit
  /// of mixed dtypes or devices, a parameter that is not in exactly one unit's list, or shards cut
  /// at build for another rank or left over.
  FullyShardedUnits(models::ShardableModel& model, runtime::Communicator& comm, bool reshard_after_forward,
                    UnitSharder* cut_at_build = nullptr);
  /// Uninstalls the hooks (the parameters stay as they are: sharded, or gathered by gather_all).
  ~FullyShardedUnits() override;
  FullyShardedUnits(const FullyShardedUnits&) = delete;
  FullyShardedUnits& operator=(const FullyShardedUnits&) = delete;

  /// The shards of the parameters that require grad, in unit order: what the optimizer trains
  /// (each [chunk_rows, ...], requires grad; their gradients are the reduce-scattered ones).
  std::vector<torch::Tensor> trainable_shards() const;
  /// The shard that holds module parameter `parameter`'s rows on this rank; undefined for a tensor
  /// that is not a sharded parameter.
  torch::Tensor shard_of(const torch::Tensor& parameter) const;

  // models::UnitHooks: the model's forward calls these.
  torch::Tensor before_forward(int unit, const torch::Tensor& input) override;
  torch::Tensor after_forward(int unit, const torch::Tensor& output) override;
  /// The unit's sink when its gradient is reduce-scattered by rows (reduced_by_row_blocks), else nullptr.
  models::RowGradientSink* row_gradient_sink(int unit) override;

  /// After each micro-batch's backward: the reduce-scatter of every unit whose gradients autograd
  /// did not hand over yet (a unit whose input needs no gradient: the embedding), waits for the
  /// reduce-scatter in flight, and reshards every unit. Collective.
  void finish_backward();
  /// Gathers every unit (for an export of the whole model, or tests): the module's parameters hold
  /// their whole values until reshard_all(). Collective.
  void gather_all();
  /// Frees every gathered unit (a prefetched gather is waited for first). Collective when a gather
  /// was in flight.
  void reshard_all();
  /// Gathers the units one at a time, in order (the next one's gather issued while fn runs), calls
  /// fn with the unit's module parameters holding their whole values, and frees the unit again: at
  /// most two units are whole at once (an export that never holds the model whole). Collective:
  /// every rank calls it. Throws what fn throws (the units are left as they are then).
  void for_each_unit_gathered(const std::function<void(const std::vector<torch::Tensor>& parameters)>& fn);

  /// The all-gathers and the reduce-scatters waited for since the last call: their seconds, each
  /// from its launch to its completion on the backend's clock (Work::seconds_since_start_of: the
  /// host's for MPI, CUDA events for NCCL, which this waits for), summed, overlapped with compute
  /// or not (the step records' allgather_s and reducescatter_s), and their bytes.
  CollectiveTotals take_collectives();

  std::int64_t num_units() const;
  ShardedMemory memory() const;

  struct State;  // the units and their collectives (fsdp_units.h)

 private:
  std::unique_ptr<State> state_;
  models::ShardableModel& model_;
};

}  // namespace mgbench::train
