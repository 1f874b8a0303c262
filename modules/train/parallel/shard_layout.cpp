#include "train/parallel/shard_layout.h"

#include <algorithm>
#include <stdexcept>

namespace mgbench::train {

bool reduced_by_row_blocks(const UnitShape& u, int world, bool always) {
  if (!u.gradient_by_rows || (always && u.gradient_whole_at_times) || u.forward_uses != 1 || u.packed_bytes != 0 ||
      u.sizes.size() != 1 || !u.trainable[0]) {
    return false;
  }
  const ShardLayout l = ShardLayout::of(u.sizes[0], world);
  return l.chunk_rows * world == l.rows;
}

ShardedMemory sharded_memory(const std::vector<UnitShape>& units, int world, std::int64_t element_bytes,
                             bool reshard_after_forward) {
  ShardedMemory m;
  std::vector<std::int64_t> resharded;  // bytes of each unit freed after its forward
  std::vector<std::int64_t> trained;    // each unit's whole gradients, padded as reduce-scattered
  std::int64_t kept = 0;
  for (const UnitShape& u : units) {
    std::int64_t unit_bytes = 0;
    std::int64_t gradient_bytes = 0;
    for (std::size_t k = 0; k < u.sizes.size(); ++k) {
      const ShardLayout l = ShardLayout::of(u.sizes[k], world);
      const std::int64_t shard_bytes = l.shard_numel() * element_bytes;
      m.shard_bytes += shard_bytes;
      if (u.trainable[k]) {
        m.trainable_shard_bytes += shard_bytes;
        gradient_bytes += shard_bytes * world;
      }
      unit_bytes += l.rows * l.row_numel * element_bytes;
    }
    if (reduced_by_row_blocks(u, world)) {  // a block computed while the one before it is reduced
      const ShardLayout l = ShardLayout::of(u.sizes[0], world);
      trained.push_back(RowGradientBlocks::of(l).rows * world * l.row_numel * element_bytes);
    } else {
      trained.push_back(gradient_bytes * u.forward_uses);
    }
    m.shard_bytes += u.packed_bytes / world;
    unit_bytes += u.packed_bytes;
    if (u.reshard_after_forward && reshard_after_forward) {
      resharded.push_back(unit_bytes);
    } else {
      kept += unit_bytes;
    }
  }
  const auto two_largest = [](std::vector<std::int64_t>& bytes) {
    std::sort(bytes.rbegin(), bytes.rend());
    std::int64_t sum = 0;
    for (std::size_t k = 0; k < std::min<std::size_t>(2, bytes.size()); ++k) sum += bytes[k];
    return sum;
  };
  m.gathered_peak_bytes = kept + two_largest(resharded);
  m.whole_gradient_peak_bytes = two_largest(trained);
  return m;
}

std::vector<UnitShape> unit_shapes(const std::vector<models::ParameterUnit>& units) {
  std::vector<UnitShape> shapes;
  for (const models::ParameterUnit& u : units) {
    UnitShape shape{{}, {}, u.reshard_after_forward};
    shape.backward_reads_parameters = u.backward_reads_parameters;
    shape.forward_uses = u.forward_uses;
    shape.gradient_by_rows = u.gradient_by_rows;
    shape.gradient_whole_at_times = u.gradient_whole_at_times;
    for (const torch::Tensor& p : u.parameters) {
      shape.sizes.push_back(p.sizes().vec());
      shape.trainable.push_back(p.requires_grad());
    }
    for (const models::PackedWeight& w : u.packed) {
      for (const torch::Tensor& part : w.parts) shape.packed_bytes += static_cast<std::int64_t>(part.nbytes());
    }
    shapes.push_back(std::move(shape));
  }
  return shapes;
}

MicroBatchCollectives micro_batch_collectives(const std::vector<UnitShape>& units, int world,
                                              std::int64_t element_bytes, bool reshard_after_forward) {
  MicroBatchCollectives c;
  std::vector<std::int64_t> gathered, trained;  // per unit: the gathered buffer, the reduce-scattered input
  for (const UnitShape& u : units) {
    std::int64_t all = 0, train = 0;
    for (std::size_t k = 0; k < u.sizes.size(); ++k) {
      const std::int64_t bytes = ShardLayout::of(u.sizes[k], world).shard_numel() * world * element_bytes;
      all += bytes;
      if (u.trainable[k]) train += bytes;
    }
    gathered.push_back(all);
    trained.push_back(train);
  }
  const auto gather = [&](std::size_t k) {
    c.all_gather_bytes.push_back(gathered[k]);
    if (units[k].packed_bytes > 0) c.all_gather_bytes.push_back(units[k].packed_bytes);  // split evenly: no padding
  };
  for (std::size_t k = 0; k < units.size(); ++k) gather(k);  // forward, in unit order
  // Backward, in reverse unit order: a gradient flows through unit k's output when a unit up to k trains.
  std::vector<bool> gradient_flows(units.size(), false);
  bool flows = false;
  for (std::size_t k = 0; k < units.size(); ++k) {
    flows = flows || trained[k] > 0;
    gradient_flows[k] = flows;
  }
  for (std::size_t k = units.size(); k-- > 0;) {
    const UnitShape& u = units[k];
    if (reshard_after_forward && u.reshard_after_forward && u.backward_reads_parameters && gradient_flows[k]) gather(k);
    if (trained[k] == 0) continue;
    if (reduced_by_row_blocks(u, world)) {
      const ShardLayout l = ShardLayout::of(u.sizes[0], world);
      const RowGradientBlocks b = RowGradientBlocks::of(l);
      for (std::int64_t block = 0; block < b.blocks; ++block) {
        c.reduce_scatter_bytes.push_back(b.rows_of(block, l) * world * l.row_numel * element_bytes);
      }
    } else {
      c.reduce_scatter_bytes.push_back(trained[k]);
    }
  }
  return c;
}

}  // namespace mgbench::train
