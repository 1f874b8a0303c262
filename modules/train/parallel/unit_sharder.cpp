#include "train/parallel/unit_sharder.h"

#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "train/parallel/fsdp_units.h"

namespace mgbench::train {

void own_whole_storage(torch::Tensor& full) {
  if (full.storage_offset() != 0 || !full.is_non_overlapping_and_dense() || full.storage().nbytes() != full.nbytes()) {
    full.set_data(full.detach().clone(torch::MemoryFormat::Contiguous));
  }
}

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

void require_packed_split(const models::PackedWeight& weight, int world) {
  MGBENCH_REQUIRE(weight.blocks % world == 0, ConfigError,
                  "--sharding fsdp over {} ranks: {} [{}] is packed in {} quantisation blocks (NF4), which {} ranks "
                  "cannot split evenly (as torchao's NF4Tensor, each rank holds whole blocks, as many as every "
                  "other): use a rank count that divides {}, or --sharding none",
                  world, weight.name, fmt::join(weight.shape, ", "), weight.blocks, world, weight.blocks);
}

torch::Tensor cut_packed_shard(const torch::Tensor& part, int rank, int world) {
  const auto shard_bytes = static_cast<std::int64_t>(part.nbytes()) / world;
  return part.detach().view({-1}).view(torch::kUInt8).narrow(0, rank * shard_bytes, shard_bytes).clone();
}

UnitSharder::UnitSharder(int rank, int world_size) : rank_(rank), world_(world_size) {
  MGBENCH_REQUIRE(world_size >= 1 && rank >= 0 && rank < world_size, std::invalid_argument,
                  "UnitSharder: rank {} of world size {}", rank, world_size);
}

void UnitSharder::shard(const models::ParameterUnit& unit, const RowSource* source) {
  for (const models::PackedWeight& w : unit.packed) require_packed_split(w, world_);
  const auto keep = [&](const torch::Tensor& full, torch::Tensor shard, const std::string& name) {
    MGBENCH_REQUIRE(shards_.emplace(full.unsafeGetTensorImpl(), std::move(shard)).second, std::logic_error,
                    "UnitSharder: {} of unit {} was cut twice", name, unit.name);
  };
  fsdp::BlockCache freeing(/*enabled=*/false);                // frees, keeps nothing
  std::vector<torch::Tensor> fulls = unit.parameters;         // the module's own tensors (set_data reaches them)
  for (torch::Tensor& full : fulls) own_whole_storage(full);  // the storage freed must be its alone
  // Every shard of the unit allocated (and filled) while the unit is whole, then the whole unit
  // freed at once: the next unit's tensors, of the same sizes, fit the holes it leaves. Freeing a
  // tensor before its shard exists (a source does not read it) lowers the peak by the unit's shards,
  // but the shards then split the holes (glibc's heap), and the heap grew by 36 MiB a decoder layer
  // of a 0.8B model for its 12 MiB of shards, measured.
  for (std::size_t k = 0; k < fulls.size(); ++k) {
    keep(fulls[k], cut_shard(fulls[k], unit.names[k], ShardLayout::of(fulls[k].sizes(), world_), rank_, source),
         unit.names[k]);
  }
  for (const torch::Tensor& full : fulls) freeing.resize_storage(full, 0);
  for (const models::PackedWeight& w : unit.packed) {
    for (torch::Tensor full : w.parts) {
      own_whole_storage(full);
      keep(full, cut_packed_shard(full, rank_, world_), w.name);
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
