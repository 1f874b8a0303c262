#include "train/parallel/parallelize.h"

#include "core/error.h"

namespace mgbench::train {

ParallelizedModel parallelize(models::ShardableModel* model, const axes::ParallelPlan& plan,
                              runtime::Communicator& comm, UnitSharder* cut_at_build) {
  ParallelizedModel out;
  if (plan.activation_checkpointing) {
    MGBENCH_REQUIRE(model != nullptr, ConfigError,
                    "--activation-checkpointing: this recipe's model has no units to recompute");
    model->set_activation_checkpointing(true);
  }
  if (plan.sharding != axes::Sharding::kFsdp) return out;
  MGBENCH_REQUIRE(model != nullptr, ConfigError,
                  "--sharding fsdp: this recipe's model has no FSDP units; use --sharding none");
  // What a micro-batch gathers and reduce-scatters, recorded at any world size (one rank too: the
  // base `mgbench predict` prices FSDP from).
  const std::vector<models::ParameterUnit> units = model->parameter_units();
  const std::int64_t element =
      units.empty() || units.front().parameters.empty() ? 0 : units.front().parameters.front().element_size();
  out.fsdp_collectives = micro_batch_collectives(unit_shapes(units), 1, element, plan.reshard_after_forward);
  // One rank: nothing to shard, the run is --sharding none's.
  if (plan.fully_sharded())
    out.fsdp = std::make_unique<FullyShardedUnits>(*model, comm, plan.reshard_after_forward, cut_at_build);
  return out;
}

}  // namespace mgbench::train
