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

/// Makes `full` own its whole storage, so that the storage can be freed and re-allocated in place:
/// a view, an offset or an overlapping layout is replaced by a copy (set_data: modules and
/// optimizers keep the tensor). A dense non-contiguous layout (a channels_last weight) is kept.
void own_whole_storage(torch::Tensor& full);

/// Rank `rank`'s shard of parameter `full` under `layout` (ShardLayout::of(full.sizes(), world)):
/// [chunk_rows, sizes[1:]...] in full's dtype on its device, the valid rows copied from full (its
/// logical row order, whatever its memory format) or, with source, read from it (full's values are
/// never read then; the source is called for an empty chunk too), the padding rows zero.
torch::Tensor cut_shard(const torch::Tensor& full, const std::string& name, const ShardLayout& layout, int rank,
                        const RowSource* source = nullptr);

/// Throws ConfigError naming the packed weight, its blocks and the world size when `world` ranks
/// cannot split its quantisation blocks evenly (torchao's NF4Tensor under FSDP2: whole blocks, as
/// many on every rank).
void require_packed_split(const models::PackedWeight& weight, int world);
/// Rank `rank`'s bytes of a packed weight's part (1-D, its bytes divisible by world): uint8
/// [nbytes / world], a copy.
torch::Tensor cut_packed_shard(const torch::Tensor& part, int rank, int world);

class UnitSharder {
 public:
  /// Throws std::invalid_argument for world_size < 1 or a rank outside [0, world_size).
  UnitSharder(int rank, int world_size);

  /// Cuts every parameter and packed weight part of `unit` to this rank's shard and frees the
  /// unit's whole storage (each tensor keeps its sizes, its storage 0 bytes: FSDP regathers into it).
  /// source: where the parameters' rows come from (nullptr: their own values); packed weights are
  /// cut from their own bytes. Throws ConfigError from require_packed_split (before anything is
  /// freed), std::logic_error for a tensor already cut, and what source throws.
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
