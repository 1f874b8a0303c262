#pragma once
// The parallelisms of a run applied to its model as transforms, in one place and in torchtitan's
// order (parallelize_llama: tensor parallelism, activation checkpointing, then FSDP's fully_shard),
// as one axes::ParallelPlan says. The loop calls it once, after the recipe built the model and
// before anything trains; a recipe never applies a parallelism itself, it only names its model's
// units (models::ShardableModel).
#include <cstdint>
#include <memory>

#include "axes/parallel_plan.h"
#include "models/parameter_units.h"
#include "runtime/communicator.h"
#include "train/parallel/fsdp.h"
#include "train/parallel/shard_layout.h"
#include "train/parallel/unit_sharder.h"

namespace mgbench::train {

/// What parallelize made of a model.
struct ParallelizedModel {
  /// The FSDP units over the ranks (a fully sharded plan); nullptr when each rank holds a replica.
  std::unique_ptr<FullyShardedUnits> fsdp;
  /// --sharding fsdp: the collectives one micro-batch issues, unpadded (world 1), at any world size
  /// -- one rank too: the base `mgbench predict` prices an FSDP step from. Empty without FSDP.
  MicroBatchCollectives fsdp_collectives;
};

/// Applies plan to model (nullptr: a recipe whose model has no units): activation checkpointing
/// (each unit recomputed in backward: models::ShardableModel::set_activation_checkpointing), then
/// FSDP over comm's ranks for a fully sharded plan (FullyShardedUnits: every parameter freed to its
/// shard, the unit hooks installed; the shards `cut_at_build` cut while the recipe built the model
/// taken as they are). Collective-free. Throws ConfigError for --sharding fsdp or activation
/// checkpointing with a model that has no units, and what FullyShardedUnits throws.
ParallelizedModel parallelize(models::ShardableModel* model, const axes::ParallelPlan& plan,
                              runtime::Communicator& comm, UnitSharder* cut_at_build = nullptr);

}  // namespace mgbench::train
