#include "axes/strategy.h"

#include <algorithm>

#include "core/option_table.h"

namespace mgbench::axes {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

/// Batches of n samples: whole batches only with drop_last. None for a shape without samples,
/// batches or ranks (a results file's attributes can say anything).
std::int64_t batches_of(std::int64_t n, const EpochShape& s) {
  if (n < 1 || s.batch_size < 1 || s.world_size < 1) return 0;
  return s.drop_last ? n / s.batch_size : ceil_div(n, s.batch_size);
}

/// Every rank computes every batch of the dataset.
std::int64_t all_batches(const EpochShape& s) { return batches_of(s.dataset_size, s); }

/// The dataset's batches dealt round robin, padded to a multiple of the world by wrapping around.
std::int64_t round_robin(const EpochShape& s) {
  const std::int64_t batches = batches_of(s.dataset_size, s);
  return batches > 0 ? ceil_div(batches, s.world_size) : 0;
}

/// DistributedSampler's share: ceil(N / world) samples, or floor with drop_last (its num_samples).
std::int64_t sampler_share(const EpochShape& s) {
  if (s.world_size < 1) return 0;
  const std::int64_t samples = s.drop_last ? s.dataset_size / s.world_size : ceil_div(s.dataset_size, s.world_size);
  return batches_of(samples, s);
}

constexpr StrategyInfo kStrategies[] = {
    {"ddp", Strategy::kDdp, "every rank loads and computes the whole dataset (N ranks do N times the work)", false,
     false, &all_batches},
    {"ddp-rr", Strategy::kDdpRr, "every rank loads every batch, rank r computes batches k with k % N == r", false, true,
     &round_robin},
    {"ddp-ds", Strategy::kDdpDs, "torch.utils.data.DistributedSampler: each rank its 1/N of the shuffled dataset",
     false, false, &sampler_share},
    {"dp", Strategy::kDp, "torch.nn.DataParallel: one process (1 rank) over every GPU of the node", true, false,
     &sampler_share},
};

}  // namespace

std::span<const StrategyInfo> strategy_choices() { return kStrategies; }

const StrategyInfo& strategy_info(Strategy s) { return options::row_of(strategy_choices(), s); }

const StrategyInfo& find_strategy(std::string_view option, std::string_view name) {
  return strategy_info(options::parse_choice(strategy_choices(), option, name));
}

std::int64_t steps_per_epoch(const StrategyInfo& strategy, const EpochShape& shape, std::int64_t grad_accum,
                             std::int64_t max_steps) {
  const std::int64_t steps = strategy.computed_batches(shape) / std::max<std::int64_t>(grad_accum, 1);
  return max_steps > 0 ? std::min(steps, max_steps) : steps;
}

}  // namespace mgbench::axes
