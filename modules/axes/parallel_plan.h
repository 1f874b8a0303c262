#pragma once
// How a run lays its model out over its ranks (--sharding, --reshard-after-forward, the recipe's
// --activation-checkpointing, the world size): decided once, as torchtitan's ParallelDims, and read
// by everything that depends on it -- train/parallel/parallelize.h applies it to the model, the loop
// records and steps by it, a recipe's memory plan (`mgbench llm --dry-run`) and `mgbench predict`
// price it at other world sizes. Torch-free, so the analysis reasons from the same plan as the run.
#include <span>

#include "core/option_table.h"

namespace mgbench::axes {

/// --sharding: how the ranks hold the model.
enum class Sharding {
  kNone,  ///< a whole replica per rank, gradients all-reduced in buckets (PyTorch DDP)
  kFsdp,  ///< parameters, gradients and optimizer state sharded on dim 0 (FSDP2's fully_shard)
};
/// none | fsdp, with their help: the option's rows.
std::span<const options::Choice<Sharding>> sharding_choices();

struct ParallelPlan {
  int world = 1;                          // ranks of the run, one per device
  Sharding sharding = Sharding::kNone;    // --sharding
  bool reshard_after_forward = true;      // --reshard-after-forward (FSDP2's; TorchTune's default True)
  bool activation_checkpointing = false;  // the recipe's --activation-checkpointing (its model's units recomputed)

  /// FSDP over several ranks. One rank is --sharding none's run: nothing to shard, nothing gathered.
  bool fully_sharded() const { return sharding == Sharding::kFsdp && world > 1; }
  /// Replicas on several ranks whose gradients the ranks all-reduce (DDP's buckets).
  bool replicated() const { return world > 1 && !fully_sharded(); }
  /// The ranks each parameter is split over: world when fully sharded, else 1.
  int shard_world() const { return fully_sharded() ? world : 1; }
  /// The same plan at another world size (a memory plan's rows, a prediction at n ranks).
  ParallelPlan at(int world_size) const {
    ParallelPlan plan = *this;
    plan.world = world_size;
    return plan;
  }
};

}  // namespace mgbench::axes
