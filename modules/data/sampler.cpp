#include "data/sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <stdexcept>

#include <fmt/format.h>

#include "core/error.h"

namespace mgbench::data {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

/// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) or arange(n).
std::vector<std::int64_t> order(std::int64_t n, std::uint64_t seed, bool shuffle) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  if (!shuffle) {
    for (std::int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = i;
    return out;
  }
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const torch::Tensor perm = torch::randperm(n, generator, torch::kLong);
  std::copy_n(perm.data_ptr<std::int64_t>(), n, out.begin());
  return out;
}

/// DistributedSampler.__init__'s num_samples: samples per rank of n.
std::int64_t per_rank_count(std::int64_t n, int world_size, bool drop_last) {
  return (drop_last && n % world_size != 0) ? ceil_div(n - world_size, world_size) : ceil_div(n, world_size);
}

std::vector<std::vector<std::int64_t>> split_batches(const std::vector<std::int64_t>& indices, std::int64_t batch_size,
                                                     bool drop_last) {
  std::vector<std::vector<std::int64_t>> batches;
  for (std::size_t start = 0; start < indices.size(); start += static_cast<std::size_t>(batch_size)) {
    const std::size_t end = std::min(indices.size(), start + static_cast<std::size_t>(batch_size));
    if (drop_last && end - start < static_cast<std::size_t>(batch_size)) break;
    batches.emplace_back(indices.begin() + static_cast<std::ptrdiff_t>(start),
                         indices.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return batches;
}

}  // namespace

std::vector<std::int64_t> distributed_sampler_indices(std::int64_t n, int world_size, int rank, std::uint64_t seed,
                                                      std::int64_t epoch, bool shuffle, bool drop_last) {
  MGBENCH_REQUIRE(world_size >= 1 && rank >= 0 && rank < world_size, ConfigError,
                  "DistributedSampler: rank {} outside [0, {})", rank, world_size);
  std::vector<std::int64_t> indices = order(n, seed + static_cast<std::uint64_t>(epoch), shuffle);
  // num_samples per rank and total size, as torch.utils.data.DistributedSampler.__init__.
  const std::int64_t num_samples = per_rank_count(n, world_size, drop_last);
  const std::int64_t total = num_samples * world_size;
  if (!drop_last) {
    const std::int64_t padding = total - n;
    if (padding > 0 && n > 0) {
      for (std::int64_t k = 0; k < padding; ++k) indices.push_back(indices[static_cast<std::size_t>(k % n)]);
    }
  } else {
    indices.resize(static_cast<std::size_t>(total));
  }
  std::vector<std::int64_t> mine;
  mine.reserve(static_cast<std::size_t>(num_samples));
  for (std::int64_t k = rank; k < total; k += world_size) mine.push_back(indices[static_cast<std::size_t>(k)]);
  return mine;
}

std::vector<std::int64_t> shard_sampler_indices(const std::vector<std::int64_t>& shard_sizes, int world_size, int rank,
                                                std::uint64_t seed, std::int64_t epoch, bool shuffle, bool drop_last) {
  std::vector<std::int64_t> first(shard_sizes.size() + 1, 0);  // first sample of each shard
  for (std::size_t s = 0; s < shard_sizes.size(); ++s) first[s + 1] = first[s] + shard_sizes[s];
  const std::int64_t n = first.back();
  MGBENCH_REQUIRE(n >= 1, ConfigError, "the training shards hold no sample");
  const auto shards = distributed_sampler_indices(static_cast<std::int64_t>(shard_sizes.size()), world_size, rank, seed,
                                                  epoch, shuffle, /*drop_last=*/false);
  std::vector<std::int64_t> mine;
  for (const std::int64_t s : shards) {
    for (std::int64_t i = first[static_cast<std::size_t>(s)]; i < first[static_cast<std::size_t>(s) + 1]; ++i) {
      mine.push_back(i);
    }
  }
  if (shuffle && !mine.empty()) {
    // Seeded apart per rank and epoch: seed + epoch, then the rank in the high half.
    const auto perm =
        order(static_cast<std::int64_t>(mine.size()),
              (seed + static_cast<std::uint64_t>(epoch)) ^ (static_cast<std::uint64_t>(rank + 1) << 32), true);
    std::vector<std::int64_t> shuffled(mine.size());
    for (std::size_t k = 0; k < perm.size(); ++k) shuffled[k] = mine[static_cast<std::size_t>(perm[k])];
    mine = std::move(shuffled);
  }
  // DistributedSampler's per-rank count of n samples.
  const std::int64_t num_samples = per_rank_count(n, world_size, drop_last);
  std::vector<std::int64_t> out(static_cast<std::size_t>(num_samples));
  const std::size_t held = mine.size();
  MGBENCH_REQUIRE(held > 0, ConfigError, "rank {}: its shards hold no sample (an empty shard)", rank);
  for (std::size_t k = 0; k < out.size(); ++k) out[k] = mine[k % held];
  return out;
}

namespace {

std::vector<PlannedBatch> plan_epoch_batches(const EpochPlanOptions& o, std::int64_t epoch) {
  MGBENCH_REQUIRE(o.batch_size >= 1, ConfigError, "--batch-size must be >= 1 (got {})", o.batch_size);
  MGBENCH_REQUIRE(o.dataset_size >= 1, ConfigError, "the training set is empty");
  std::vector<PlannedBatch> plan;
  if (o.strategy == axes::Strategy::kDdpDs || o.strategy == axes::Strategy::kDp) {
    const auto indices =
        o.shard_sizes.empty()
            ? distributed_sampler_indices(o.dataset_size, o.world_size, o.rank, o.seed, epoch, o.shuffle, o.drop_last)
            : shard_sampler_indices(o.shard_sizes, o.world_size, o.rank, o.seed, epoch, o.shuffle, o.drop_last);
    auto batches = split_batches(indices, o.batch_size, o.drop_last);
    for (std::size_t k = 0; k < batches.size(); ++k) {
      plan.push_back({static_cast<std::int64_t>(k), std::move(batches[k]), true});
    }
    return plan;
  }
  // ddp and ddp-rr: every rank sees the same shuffled order (same seed on every rank).
  const auto indices = order(o.dataset_size, o.seed + static_cast<std::uint64_t>(epoch), o.shuffle);
  auto batches = split_batches(indices, o.batch_size, o.drop_last);
  MGBENCH_REQUIRE(!batches.empty(), ConfigError, "--batch-size {} with drop_last leaves no batch of {} samples",
                  o.batch_size, o.dataset_size);
  if (o.strategy == axes::Strategy::kDdp) {
    for (std::size_t k = 0; k < batches.size(); ++k) {
      plan.push_back({static_cast<std::int64_t>(k), std::move(batches[k]), true});
    }
    return plan;
  }
  const auto nb = static_cast<std::int64_t>(batches.size());
  const std::int64_t loads = ceil_div(nb, o.world_size) * o.world_size;
  for (std::int64_t k = 0; k < loads; ++k) {
    plan.push_back({k, batches[static_cast<std::size_t>(k % nb)], k % o.world_size == o.rank});
  }
  return plan;
}

}  // namespace

std::vector<PlannedBatch> plan_epoch(const EpochPlanOptions& o, std::int64_t epoch) {
  std::vector<PlannedBatch> plan = plan_epoch_batches(o, epoch);
  for (auto& batch : plan) batch.epoch = epoch;
  return plan;
}

axes::EpochShape epoch_shape(const EpochPlanOptions& o) {
  return {o.dataset_size, o.batch_size, o.world_size, o.drop_last};
}

}  // namespace mgbench::data
