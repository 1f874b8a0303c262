#include "train/checkpoint/reshard.h"

#include <filesystem>
#include <optional>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "models/parameter_units.h"

namespace mgbench::train {
namespace {

/// Old rank r's shard of `name`, checked to be a shard of `from`'s layout.
torch::Tensor old_shard(const CheckpointState& state, const std::string& name, const models::ShardLayout& from) {
  const torch::Tensor stored = state.tensor(name);
  MGBENCH_REQUIRE(stored.sizes() == at::IntArrayRef(from.shard_sizes()), DataError,
                  "checkpoint '{}': '{}' is {}, and a shard of {} over {} rank(s) is {}", state.source(), name,
                  fmt::join(stored.sizes(), "x"), fmt::join(from.sizes, "x"), from.world,
                  fmt::join(from.shard_sizes(), "x"));
  return stored;
}

/// This rank's shard at world_size of a tensor sharded over old.size() ranks (padding rows zero):
/// the rows it holds copied from each old rank whose chunk overlaps them.
torch::Tensor cut_anew(const std::vector<CheckpointState>& old, const std::string& name,
                       const std::vector<std::int64_t>& whole, int rank, int world_size) {
  const models::ShardLayout from = models::ShardLayout::of(whole, static_cast<int>(old.size()));
  const models::ShardLayout to = models::ShardLayout::of(whole, world_size);
  const std::int64_t begin = to.first_row(rank);
  const std::int64_t end = begin + to.valid_rows(rank);
  torch::Tensor shard;
  for (int r = 0; r < from.world; ++r) {
    const std::int64_t lo = std::max(begin, from.first_row(r));
    const std::int64_t hi = std::min(end, from.first_row(r) + from.valid_rows(r));
    if (lo >= hi) continue;
    MGBENCH_REQUIRE(old[r].contains(name), DataError, "checkpoint '{}' has no tensor '{}', whose rows {}..{} it holds",
                    old[r].source(), name, from.first_row(r), from.first_row(r) + from.valid_rows(r) - 1);
    const torch::Tensor stored = old_shard(old[r], name, from);
    if (!shard.defined()) shard = torch::zeros(to.shard_sizes(), stored.options());
    MGBENCH_REQUIRE(stored.scalar_type() == shard.scalar_type(), DataError,
                    "checkpoint '{}': '{}' is {}, another rank's is {}", old[r].source(), name,
                    c10::toString(stored.scalar_type()), c10::toString(shard.scalar_type()));
    shard.view({to.chunk_rows, to.row_numel})
        .narrow(0, lo - begin, hi - lo)
        .copy_(stored.reshape({from.chunk_rows, from.row_numel}).narrow(0, lo - from.first_row(r), hi - lo));
  }
  if (!shard.defined()) {  // this rank holds padding only: a shard of the dtype any rank stored
    for (const CheckpointState& state : old) {
      if (state.contains(name)) return torch::zeros(to.shard_sizes(), old_shard(state, name, from).options());
    }
  }
  return shard;
}

bool derived_entry(const std::string& key) {
  return key == "rank" || key.starts_with("crc32:") || key.starts_with("shard:");
}

}  // namespace

CheckpointState reshard_checkpoint(const std::vector<std::string>& files, int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size || files.empty()) {
    throw std::invalid_argument(
        fmt::format("reshard_checkpoint: rank {} of {} from {} file(s)", rank, world_size, files.size()));
  }
  std::vector<CheckpointState> old;
  old.reserve(files.size());
  for (std::size_t r = 0; r < files.size(); ++r) {
    old.emplace_back(files[r]);
    old.back().check_rank(static_cast<int>(r));
  }
  // The own rank file first, then the others: whole tensors and metadata come from the first that has them.
  const std::size_t own = static_cast<std::size_t>(rank) % old.size();
  std::vector<const CheckpointState*> order{&old[own]};
  for (std::size_t r = 0; r < old.size(); ++r) {
    if (r != own) order.push_back(&old[r]);
  }
  CheckpointState out;
  out.set_source(fmt::format("{} (its {} rank files cut for rank {} of {})",
                             std::filesystem::path(files[0]).parent_path().string(), files.size(), rank, world_size));
  std::set<std::string> done;
  for (const CheckpointState* from : order) {
    for (const std::string& name : from->names()) {
      if (!done.insert(name).second) continue;
      const std::optional<std::vector<std::int64_t>> whole = from->whole_shape(name);
      if (!whole) {
        out.put(name, from->tensor(name));
        continue;
      }
      for (const CheckpointState& other : old) {
        const auto theirs = other.whole_shape(name);
        MGBENCH_REQUIRE(!other.contains(name) || theirs == whole, DataError,
                        "checkpoint '{}': '{}' is a shard of {}, in '{}' of {}", other.source(), name,
                        theirs ? fmt::format("{}", fmt::join(*theirs, "x")) : std::string("none (stored whole)"),
                        from->source(), fmt::join(*whole, "x"));
      }
      out.put_shard(name, cut_anew(old, name, *whole, rank, world_size), *whole, world_size);
    }
  }
  std::set<std::string> keys;
  for (const CheckpointState* from : order) {
    for (const auto& [key, value] : from->metadata()) {
      if (!derived_entry(key) && keys.insert(key).second) out.put_text(key, value);
    }
  }
  return out;
}

}  // namespace mgbench::train
