#include "train/parallel/unit_sharder.h"

#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "train/parallel/fsdp_units.h"

namespace mgbench::train {
namespace {

/// Makes `full` own its whole storage, so that the storage can be freed and re-allocated in place:
/// a view, an offset or an overlapping layout is replaced by a copy (set_data: modules and
/// optimizers keep the tensor). A dense non-contiguous layout (a channels_last weight) is kept.
void own_whole_storage(torch::Tensor& full) {
  if (full.storage_offset() != 0 || !full.is_non_overlapping_and_dense() || full.storage().nbytes() != full.nbytes()) {
    full.set_data(full.detach().clone(torch::MemoryFormat::Contiguous));
  }
}

/// torchao's NF4Tensor under FSDP2: each rank holds whole blocks, as many as every other.
void require_packed_split(const models::PackedWeight& weight, int world) {
  MGBENCH_REQUIRE(weight.blocks % world == 0, ConfigError,
                  "--sharding fsdp over {} ranks: {} [{}] is packed in {} quantisation blocks (NF4), which {} ranks "
                  "cannot split evenly (as torchao's NF4Tensor, each rank holds whole blocks, as many as every "
                  "other): use a rank count that divides {}, or --sharding none",
                  world, weight.name, fmt::join(weight.shape, ", "), weight.blocks, world, weight.blocks);
}

/// Rank `rank`'s shard of parameter `full` under `layout` (ShardLayout::of(full.sizes(), world)):
/// [chunk_rows, sizes[1:]...] in full's dtype on its device, the valid rows copied from full (its
/// logical row order, whatever its memory format) or, with source, read from it (full's values are
/// never read then; the source is called for an empty chunk too), the padding rows zero.
torch::Tensor cut_shard(const torch::Tensor& full, const std::string& name, const ShardLayout& layout, int rank,
                        const RowSource* source) {
  torch::NoGradGuard no_grad;
  torch::Tensor shard = torch::zeros(layout.shard_sizes(), full.options().requires_grad(false));
  const std::int64_t rows = layout.valid_rows(rank);
  if (source != nullptr) {
    // Called for an empty chunk too (a rank past the last row): the source checks the tensor's shape
    // and counts it read on every rank alike.
    std::vector<std::int64_t> sizes = layout.shard_sizes();
    sizes[0] = rows;
    (*source)(name, layout.sizes, layout.first_row(rank),
              shard.view({layout.chunk_rows, layout.row_numel}).narrow(0, 0, rows).view(sizes));
    return shard;
  }
  if (rows == 0) return shard;
  shard.view({layout.chunk_rows, layout.row_numel})
      .narrow(0, 0, rows)
      .copy_(full.detach().reshape({layout.rows, layout.row_numel}).narrow(0, layout.first_row(rank), rows));
  return shard;
}

/// Rank `rank`'s bytes of a packed weight's part (1-D, its bytes divisible by world): uint8
/// [nbytes / world], a copy.
torch::Tensor cut_packed_shard(const torch::Tensor& part, int rank, int world) {
  const auto shard_bytes = static_cast<std::int64_t>(part.nbytes()) / world;
  return part.detach().view({-1}).view(torch::kUInt8).narrow(0, rank * shard_bytes, shard_bytes).clone();
}

}  // namespace

UnitSharder::UnitSharder(int rank, int world_size) : rank_(rank), world_(world_size) {
  MGBENCH_REQUIRE(world_size >= 1 && rank >= 0 && rank < world_size, std::invalid_argument,
                  "UnitSharder: rank {} of world size {}", rank, world_size);
}

void UnitSharder::shard(const models::ParameterUnit& unit, const RowSource* source) {
  for (const models::PackedWeight& w : unit.packed) require_packed_split(w, world_);
  const auto not_cut = [&](const torch::Tensor& t) { return shards_.count(t.unsafeGetTensorImpl()) == 0; };
  fsdp::BlockCache freeing(/*enabled=*/false);                      // frees, keeps nothing
  std::vector<std::pair<torch::Tensor, const std::string*>> fulls;  // the module's own tensors (set_data reaches them)
  for (std::size_t k = 0; k < unit.parameters.size(); ++k) {
    if (not_cut(unit.parameters[k])) fulls.emplace_back(unit.parameters[k], &unit.names[k]);
  }
  for (auto& [full, _] : fulls) own_whole_storage(full);  // the storage freed must be its alone
  // Every shard of the unit allocated (and filled) while the unit is whole, then the whole unit
  // freed at once: the next unit's tensors, of the same sizes, fit the holes it leaves. Freeing a
  // tensor before its shard exists (a source does not read it) lowers the peak by the unit's shards,
  // but the shards then split the holes (glibc's heap), and the heap grew by 36 MiB a decoder layer
  // of a 0.8B model for its 12 MiB of shards, measured.
  for (const auto& [full, name] : fulls) {
    shards_.emplace(full.unsafeGetTensorImpl(),
                    cut_shard(full, *name, ShardLayout::of(full.sizes(), world_), rank_, source));
  }
  for (const auto& [full, _] : fulls) freeing.resize_storage(full, 0);
  for (const models::PackedWeight& w : unit.packed) {
    for (torch::Tensor full : w.parts) {
      if (!not_cut(full)) continue;
      own_whole_storage(full);  // 1-D: contiguous
      shards_.emplace(full.unsafeGetTensorImpl(), cut_packed_shard(full, rank_, world_));
      freeing.resize_storage(full, 0);
    }
  }
}

torch::Tensor UnitSharder::take(const torch::Tensor& full) {
  const auto it = shards_.find(full.unsafeGetTensorImpl());
  if (it == shards_.end()) return {};
  torch::Tensor shard = std::move(it->second);
  shards_.erase(it);
  return shard;
}

}  // namespace mgbench::train
