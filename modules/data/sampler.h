#pragma once
// Which samples a rank loads and computes on, epoch by epoch, per workload-distribution strategy
// (axes/strategy.h: the strategies and what each rank computes per epoch). The plan of an epoch is
// the order of its batches with their dataset indices; for ddp-ds (and dp) it is
// torch.utils.data.DistributedSampler's, bit for bit.
// Adding a strategy: its row in axes/strategy.cpp and its plan in plan_epoch.
#include <cstdint>
#include <vector>

#include "axes/strategy.h"

namespace mgbench::data {

/// The index sequence torch.utils.data.DistributedSampler(dataset of size n, num_replicas=world_size,
/// rank, shuffle, seed, drop_last) yields after set_epoch(epoch). Shuffling uses torch.randperm
/// with a CPU generator seeded seed + epoch, exactly as PyTorch does (torch/utils/data/distributed.py).
std::vector<std::int64_t> distributed_sampler_indices(std::int64_t n, int world_size, int rank, std::uint64_t seed,
                                                      std::int64_t epoch, bool shuffle, bool drop_last);

/// The shard-level DistributedSampler of datasets in tar shards (webdataset), for ddp-ds and dp:
/// the shards (shard_sizes[s] samples each, the samples of shard s numbered after those of shards
/// 0..s-1) go to the ranks as DistributedSampler(num_shards) gives indices -- shuffled with the seed
/// seed + epoch, padded by wrapping around, rank r taking every world_size-th -- so each rank reads
/// whole shards; the rank's samples are then shuffled (a torch.randperm seeded by seed, epoch and
/// rank) and wrapped around or cut to DistributedSampler(num_samples)'s per-rank count, so that
/// every rank runs the same number of steps in every epoch (a rank whose shards hold more samples
/// than the mean leaves the excess out of that epoch). Throws ConfigError for an empty dataset.
std::vector<std::int64_t> shard_sampler_indices(const std::vector<std::int64_t>& shard_sizes, int world_size, int rank,
                                                std::uint64_t seed, std::int64_t epoch, bool shuffle, bool drop_last);

struct PlannedBatch {
  std::int64_t batch_index = 0;       // position in the epoch's loading order
  std::vector<std::int64_t> indices;  // dataset indices of the batch
  bool compute = true;                // false: loaded and transferred only (ddp-rr)
  std::int64_t epoch = 0;             // the epoch it belongs to (the seed of its random augmentation)
};

struct EpochPlanOptions {
  axes::Strategy strategy = axes::Strategy::kDdpDs;
  std::int64_t dataset_size = 0;
  std::int64_t batch_size = 1;  // per rank
  int world_size = 1;
  int rank = 0;
  std::uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;  // drop the last incomplete batch (and, for ddp-ds, the sampler's tail)
  /// Samples per tar shard (sum = dataset_size): ddp-ds and dp then distribute whole shards
  /// (shard_sampler_indices). Empty: sample-level DistributedSampler.
  std::vector<std::int64_t> shard_sizes;
};

/// The batches this rank loads in one epoch, in order. Every rank computes the same number of
/// batches (so every rank takes part in every all-reduce); for ddp-rr the round-robin is
/// padded by wrapping around to the first batches, as DistributedSampler pads its indices.
/// Throws ConfigError when batch_size < 1 or the dataset is empty.
std::vector<PlannedBatch> plan_epoch(const EpochPlanOptions& options, std::int64_t epoch);

/// The epoch's shape for the strategy row's counts (axes::StrategyInfo::computed_batches).
axes::EpochShape epoch_shape(const EpochPlanOptions& options);

}  // namespace mgbench::data
