#pragma once
// FSDP's shards cut while the model is being built, a unit at a time, so that a rank never holds
// more than its shards and the one unit being built: the place of torch's meta-device
// initialisation, where torchtitan and TorchTune's distributed recipes build the model without
// storage, fully_shard it and then materialise each rank's shards (FSDP2's FSDPParam
// reset_sharded_param; TorchTune's load_from_full_model_state_dict). A recipe that builds its
// model unit by unit hands each unit here as soon as it exists; FullyShardedUnits (fsdp.h) later
// takes these shards instead of cutting them from whole parameters. Each shard is the one
// FullyShardedUnits would cut (the same ShardLayout, the same bytes), so a model sharded at build
// equals one sharded after it: random values are drawn for the whole unit (the generator's
// sequence as one rank draws it) and cut, and a checkpoint's tensors are read for this rank's rows
// only (RowSource), never whole.
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

#include <torch/torch.h>

#include "models/parameter_units.h"
#include "train/parallel/shard_layout.h"

namespace mgbench::train {

/// Where a sharded parameter's rows come from instead of its own values (a checkpoint): fills rows
/// [first_row, first_row + rows.size(0)) of parameter `name` (its full name), whose whole shape is
/// `sizes`, into `rows` (a view of the shard: device and dtype the parameter's). Throws what the
/// source throws (DataError naming the file and tensor).
using RowSource = std::function<void(const std::string& name, c10::IntArrayRef sizes, std::int64_t first_row,
                                     const torch::Tensor& rows)>;

class UnitSharder {
 public:
  /// Throws std::invalid_argument for world_size < 1 or a rank outside [0, world_size).
  UnitSharder(int rank, int world_size);

  /// Cuts every parameter and packed weight part of `unit` to this rank's shard (FSDP2's:
  /// torch.chunk's chunk on dim 0, padded to the first chunk's rows; packed parts split evenly as
  /// bytes) and frees the unit's whole storage (each tensor keeps its sizes, its storage 0 bytes:
  /// FSDP regathers into it). A tensor cut already (and not taken) keeps its shard, so that
  /// FullyShardedUnits cuts, through the same call, whatever the build did not. A tensor that does
  /// not own its whole storage (a view) is first given a copy of its own. source: where the
  /// parameters' rows come from (nullptr: their own values); packed weights are cut from their own
  /// bytes. Throws ConfigError naming a packed weight whose quantisation blocks world_size ranks
  /// cannot split evenly (torchao's NF4Tensor under FSDP2: whole blocks, as many on every rank),
  /// before anything is freed, and what source throws.
  void shard(const models::ParameterUnit& unit, const RowSource* source = nullptr);
  /// The shard cut for `full` (a parameter or packed part shard() was given), handed over once;
  /// undefined when there is none.
  torch::Tensor take(const torch::Tensor& full);
  /// Shards cut and not taken yet.
  std::size_t pending() const { return shards_.size(); }
  int rank() const { return rank_; }
  int world_size() const { return world_; }

 private:
  int rank_;
  int world_;
  std::unordered_map<const c10::TensorImpl*, torch::Tensor> shards_;
};

}  // namespace mgbench::train
