#pragma once
// FSDP's arithmetic, without collectives: how a parameter is sharded on dim 0 (FSDP2's
// _chunk_with_empty and padding), what a rank then holds of a model, and which collectives a
// micro-batch issues. Shared by FullyShardedUnits (train/parallel/fsdp.h), `mgbench llm --dry-run`'s
// memory plan and the run attributes `mgbench predict` reads.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "models/parameter_units.h"

namespace mgbench::train {

/// How FSDP2 shards one parameter on dim 0 (models/parameter_units.h: checkpoints cut shards by
/// it too).
using ShardLayout = models::ShardLayout;

/// Bytes of parameters and gradients a rank holds under FSDP.
struct ShardedMemory {
  std::int64_t shard_bytes = 0;            // every parameter's shard, padding included
  std::int64_t trainable_shard_bytes = 0;  // the shards the optimizer trains: their gradients' size
  /// Whole units gathered at once at the peak: those kept from forward to the end of backward
  /// (the root, the head, a tied embedding) and the two largest others (one computing, the next
  /// prefetched); every unit without reshard_after_forward.
  std::int64_t gathered_peak_bytes = 0;
  /// Whole gradients held beside the shards at the peak: a unit's from backward computing them to
  /// the end of their reduce-scatter (its flat input, padding included), while the next unit's
  /// are computed (one reduce-scatter in flight): the two largest trained units' bytes, a unit
  /// used twice in forward counted twice (its second gradient is made before it is summed), a unit
  /// reduced by RowGradientBlocks one block.
  std::int64_t whole_gradient_peak_bytes = 0;
};

/// A unit as FSDP's memory arithmetic sees it: its parameters' shapes, which the optimizer trains,
/// and whether it is freed after its forward (models::ParameterUnit::reshard_after_forward).
struct UnitShape {
  std::vector<std::vector<std::int64_t>> sizes;
  std::vector<bool> trainable;
  bool reshard_after_forward = true;
  std::int64_t packed_bytes = 0;          // frozen packed weights' sharded parts (NF4), whole, split evenly
  bool backward_reads_parameters = true;  // models::ParameterUnit's: false, not gathered for backward
  int forward_uses = 1;                   // models::ParameterUnit's: 2, two whole gradients at once
  bool gradient_by_rows = false;          // models::ParameterUnit's
  bool gradient_whole_at_times = false;   // models::ParameterUnit's: counted whole
};

/// How FSDP reduce-scatters the gradient of a unit whose weight hands it over by rows
/// (models::ParameterUnit::gradient_by_rows): in `blocks` reduce-scatters, block b the rows
/// [b * rows, min((b + 1) * rows, chunk_rows)) of every rank's shard, rank by rank (the
/// reduce-scatter's rank-major input), so each block is at most 1/kRowGradientBlocks of the
/// gradient and a rank holds two at once (one computed, one reduced), not the whole.
struct RowGradientBlocks {
  static constexpr std::int64_t kRowGradientBlocks = 16;
  std::int64_t rows = 1;    // of each rank's shard per block (the last block may have fewer)
  std::int64_t blocks = 1;  // ceil(chunk_rows / rows)

  static RowGradientBlocks of(const ShardLayout& l) {
    RowGradientBlocks b;
    b.rows = std::max<std::int64_t>(1, (l.chunk_rows + kRowGradientBlocks - 1) / kRowGradientBlocks);
    b.blocks = std::max<std::int64_t>(1, (l.chunk_rows + b.rows - 1) / b.rows);
    return b;
  }
  /// Rows of each rank's shard in block k.
  std::int64_t rows_of(std::int64_t k, const ShardLayout& l) const { return std::min(rows, l.chunk_rows - k * rows); }
};

/// Whether FSDP reduces unit u's gradient by RowGradientBlocks at `world` ranks when the model hands
/// it over by rows: a trained unit of one weight, nothing packed, used once in forward, handing its
/// gradient over by rows, whose rows divide evenly over the ranks (FullyShardedUnits' in-place
/// collectives). always: and in every step (not gradient_whole_at_times): what the memory and
/// collective arithmetic count.
bool reduced_by_row_blocks(const UnitShape& u, int world, bool always = true);

/// What a rank holds of units of element_bytes-sized elements sharded over world ranks
/// (ShardLayout's padded shards, the packed bytes split evenly; reshard_after_forward: the option).
/// The arithmetic of FullyShardedUnits::memory() and of `mgbench llm --dry-run`'s plan.
ShardedMemory sharded_memory(const std::vector<UnitShape>& units, int world, std::int64_t element_bytes,
                             bool reshard_after_forward);

/// The units' shapes (models::ParameterUnit's parameters, which require grad, reshard flag).
std::vector<UnitShape> unit_shapes(const std::vector<models::ParameterUnit>& units);

/// The collectives FullyShardedUnits issues for one micro-batch's forward and backward, in order,
/// each the bytes of its whole buffer as nccl-tests counts them (an all-gather's output, a
/// reduce-scatter's input) at `world` ranks, padding included (world 1: the units' own bytes):
/// every unit gathered once before its forward; in backward, gathered again when it was freed after
/// forward (reshard_after_forward, the unit's and the option), its backward reads its parameters
/// and a gradient flows through its output (it or a unit before it trains), a unit with packed weights gathering their
/// bytes in a second all-gather right after its first; each unit that trains reduce-scatters its gradients' shards
/// once. What `mgbench predict` prices for an FSDP step (the run attributes fsdp_allgather_bytes /
/// fsdp_reducescatter_bytes).
struct MicroBatchCollectives {
  std::vector<std::int64_t> all_gather_bytes;
  std::vector<std::int64_t> reduce_scatter_bytes;
};
MicroBatchCollectives micro_batch_collectives(const std::vector<UnitShape>& units, int world,
                                              std::int64_t element_bytes, bool reshard_after_forward);

}  // namespace mgbench::train
