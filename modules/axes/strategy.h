#pragma once
// Workload-distribution strategies (--strategy; Lawenda et al. 2025, sec. 3.2; ARCHITECTURE.md
// "Semantics"), one descriptor row each, with what the rest of mgbench needs to know of them
// without loading a batch: which samples a rank computes per epoch, how many batches it loads for
// each, whether it is a single process. data/sampler.h plans the epochs (the indices, in order);
// report/predict.h predicts from the same rows.
//   ddp    every rank loads and computes the whole dataset (N ranks do N times the work);
//   ddp-rr every rank loads and transfers every batch, rank r computes batch k when
//          k % world_size == r;
//   ddp-ds torch.utils.data.DistributedSampler: shuffle with a generator seeded seed + epoch,
//          pad to a multiple of world_size by wrapping around (or drop the tail), take
//          indices[rank::world_size];
//   dp     one process over several GPUs (torch.nn.DataParallel): planned as ddp-ds on one rank;
//          the replication is the model's side (train/recipes/data_parallel.h).
// Adding a strategy: its enum value and row here, its plan in data/sampler.cpp (plan_epoch).
#include <cstdint>
#include <span>
#include <string_view>

namespace mgbench::axes {

enum class Strategy { kDdp, kDdpRr, kDdpDs, kDp };

/// The sizes of one epoch of a strategy on one rank.
struct EpochShape {
  std::int64_t dataset_size = 0;  // samples
  std::int64_t batch_size = 1;    // samples per micro-batch per rank
  int world_size = 1;
  bool drop_last = false;  // drop the last incomplete batch (and, for ddp-ds, the sampler's tail)
};

/// A row of the strategy table, in the manner of nccl-tests' testColl descriptors.
struct StrategyInfo {
  std::string_view name;
  Strategy value;
  std::string_view help;
  bool single_process;     // one rank drives every GPU of the node (dp)
  bool loads_every_batch;  // every rank loads and copies every batch, computing 1/N of them (ddp-rr)
  /// Micro-batches each rank computes per epoch (the same on every rank and in every epoch):
  /// what data::plan_epoch's plan holds with compute = true.
  std::int64_t (*computed_batches)(const EpochShape& shape);
};

std::span<const StrategyInfo> strategy_choices();
const StrategyInfo& strategy_info(Strategy s);
/// The row named name; throws ConfigError naming `option` and the strategies.
const StrategyInfo& find_strategy(std::string_view option, std::string_view name);

/// Optimizer steps per epoch per rank, as the training loop counts them: the computed micro-batches
/// in whole steps of grad_accum, capped by max_steps (0: no cap).
std::int64_t steps_per_epoch(const StrategyInfo& strategy, const EpochShape& shape, std::int64_t grad_accum,
                             std::int64_t max_steps);

}  // namespace mgbench::axes
