#include "axes/parallel_plan.h"

namespace mgbench::axes {
namespace {

constexpr options::Choice<Sharding> kShardings[] = {
    {"none", Sharding::kNone, "a whole replica per rank, gradients all-reduced in buckets (DDP)"},
    {"fsdp", Sharding::kFsdp,
     "parameters, gradients and optimizer state sharded over the ranks, units gathered for their forward and "
     "backward (FSDP2's fully_shard, as TorchTune's distributed recipes)"},
};

}  // namespace

std::span<const options::Choice<Sharding>> sharding_choices() { return kShardings; }

}  // namespace mgbench::axes
