#pragma once
// Which samples a rank loads and computes on, per workload-distribution strategy
// (Lawenda et al. 2025, sec. 3.2; ARCHITECTURE.md "Semantics"):
//   ddp    every rank loads and computes the whole dataset (N ranks do N times the work);
//   ddp-rr every rank loads and transfers every batch, rank r computes batch k when
//          k % world_size == r;
//   ddp-ds torch.utils.data.DistributedSampler: shuffle with a generator seeded seed + epoch,
//          pad to a multiple of world_size by wrapping around (or drop the tail), take
//          indices[rank::world_size].
//   dp     one process over several GPUs (torch.nn.DataParallel): planned as ddp-ds on one rank;
//          the replication is the model's side (train/data_parallel.h).
// Adding a strategy: a row in sampler.cpp's table and its plan in plan_epoch.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mgbench::data {

enum class Strategy { kDdp, kDdpRr, kDdpDs, kDp };

/// A row of the strategy table (--strategy), in the manner of nccl-tests' testColl descriptors.
struct StrategyInfo {
  std::string_view name;
  Strategy value;
  std::string_view help;
  bool single_process;  // one rank drives every GPU of the node (dp)
};

std::span<const StrategyInfo> strategy_choices();
const StrategyInfo& strategy_info(Strategy s);

/// The index sequence torch.utils.data.DistributedSampler(dataset of size n, num_replicas=world_size,
/// rank, shuffle, seed, drop_last) yields after set_epoch(epoch). Shuffling uses torch.randperm
/// with a CPU generator seeded seed + epoch, exactly as PyTorch does (torch/utils/data/distributed.py).
std::vector<std::int64_t> distributed_sampler_indices(std::int64_t n, int world_size, int rank, std::uint64_t seed,
                                                      std::int64_t epoch, bool shuffle, bool drop_last);

struct PlannedBatch {
  std::int64_t batch_index = 0;       // position in the epoch's loading order
  std::vector<std::int64_t> indices;  // dataset indices of the batch
  bool compute = true;                // false: loaded and transferred only (ddp-rr)
};

struct EpochPlanOptions {
  Strategy strategy = Strategy::kDdpDs;
  std::int64_t dataset_size = 0;
  std::int64_t batch_size = 1;  // per rank
  int world_size = 1;
  int rank = 0;
  std::uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = false;  // drop the last incomplete batch (and, for ddp-ds, the sampler's tail)
};

/// The batches this rank loads in one epoch, in order. Every rank computes the same number of
/// batches (so every rank takes part in every all-reduce); for ddp-rr the round-robin is
/// padded by wrapping around to the first batches, as DistributedSampler pads its indices.
/// Throws ConfigError when batch_size < 1 or the dataset is empty.
std::vector<PlannedBatch> plan_epoch(const EpochPlanOptions& options, std::int64_t epoch);

/// Number of batches this rank computes per epoch (the same for every epoch).
std::int64_t computed_batches_per_epoch(const EpochPlanOptions& options);

}  // namespace mgbench::data
