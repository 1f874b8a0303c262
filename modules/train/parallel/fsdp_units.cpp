#include <cmath>
#include <utility>

#include "core/error.h"
#include "profile/nvtx.h"
#include "train/parallel/fsdp_units.h"

namespace mgbench::train {
namespace {

using fsdp::PackedPart;
using fsdp::Param;
using fsdp::PendingReduce;
using fsdp::Unit;
using fsdp::UnitState;

/// FSDP2's divide for the mean over `world` ranks (_get_gradient_divide_factors): fp32 and bf16
/// sum and divide after (NCCL's AVG); other dtypes (fp16, fp64) divide by a power of two before
/// the sum, against overflow, and by the rest after.
std::pair<double, double> divide_factors(torch::ScalarType dtype, int world) {
  if (dtype == torch::kFloat32 || dtype == torch::kBFloat16) return {1.0, static_cast<double>(world)};
  double pre = 1;
  const double factor = world;
  while (std::fmod(factor, pre) == 0 && factor / pre > pre) pre *= 2;
  return {pre, factor / pre};
}

}  // namespace

void FullyShardedUnits::State::issue_gather(Unit& u) {
  if (u.state != UnitState::kSharded) return;
  torch::NoGradGuard no_grad;
  if (u.in_place) {
    Param& p = u.params.front();
    cache.resize_storage(p.full, p.full_nbytes);
    u.gather_input = p.shard.detach().view({-1});
    u.gather_output = p.full.variable_data().view({-1});
  } else {
    std::vector<torch::Tensor> flats;
    flats.reserve(u.params.size());
    for (const Param& p : u.params) flats.push_back(p.shard.detach().reshape({-1}));
    u.gather_input = cache.empty(u.flat_numel, u.options);
    torch::cat_out(u.gather_input, flats);
    u.gather_output = cache.empty(world() * u.flat_numel, u.options);
  }
  u.gather = comm.all_gather(u.gather_input, u.gather_output);
  if (u.packed_bytes > 0) {
    const auto bytes = torch::TensorOptions().dtype(torch::kUInt8).device(u.packed.front().shard.device());
    std::vector<torch::Tensor> shards;
    shards.reserve(u.packed.size());
    for (const PackedPart& p : u.packed) shards.push_back(p.shard);
    u.packed_input = cache.empty(u.packed_bytes, bytes);
    torch::cat_out(u.packed_input, shards);
    u.packed_output = cache.empty(world() * u.packed_bytes, bytes);
    u.packed_gather = comm.all_gather(u.packed_input, u.packed_output);
  }
  u.state = UnitState::kGathering;
}

void FullyShardedUnits::State::copy_out(Unit& u) {
  // The gathered buffer is rank-major: [rank 0's shards][rank 1's shards]...; each parameter's rows
  // are copied out of every rank's piece (FSDP2's foreach_all_gather_copy_out). Written through
  // variable_data(): autograd's version counter stays as forward saved it.
  const int n = world();
  const torch::Tensor by_rank = u.gather_output.view({n, u.flat_numel});
  for (Param& p : u.params) {
    cache.resize_storage(p.full, p.full_nbytes);
    const ShardLayout& l = p.layout;
    const torch::Tensor full = p.full.variable_data();
    if (!full.is_contiguous()) {
      // Another memory format (channels_last): rank r's rows into their strided rows.
      std::vector<std::int64_t> rows_shape = l.shard_sizes();
      for (int r = 0; r < n; ++r) {
        rows_shape[0] = l.valid_rows(r);
        if (rows_shape[0] == 0) continue;
        full.narrow(0, l.first_row(r), rows_shape[0])
            .copy_(by_rank[r].narrow(0, p.offset, rows_shape[0] * l.row_numel).view(rows_shape));
      }
      continue;
    }
    torch::Tensor flat = full.view({-1});
    if (l.chunk_rows * n == l.rows) {
      flat.view({n, l.shard_numel()}).copy_(by_rank.narrow(1, p.offset, l.shard_numel()));
      continue;
    }
    for (int r = 0; r < n; ++r) {
      const std::int64_t rows = l.valid_rows(r);
      if (rows == 0) continue;
      flat.narrow(0, l.first_row(r) * l.row_numel, rows * l.row_numel)
          .copy_(by_rank[r].narrow(0, p.offset, rows * l.row_numel));
    }
  }
}

void FullyShardedUnits::State::wait_gather(Unit& u) {
  if (u.state == UnitState::kGathered) return;
  issue_gather(u);
  // Nsight Systems' timeline names FSDP's collectives by these ranges (the kernels are NCCL's own).
  const profile::NvtxRange range("fsdp all-gather");
  u.gather->wait();
  torch::NoGradGuard no_grad;
  const int n = world();
  gathered_bytes += static_cast<std::int64_t>(u.gather_output.nbytes());
  if (u.in_place) {  // the values are in place already; the buffers are the shard and the parameter
    u.gather_input = torch::Tensor();
    u.gather_output = torch::Tensor();
  } else {
    copy_out(u);
    cache.release(u.gather_input);
    cache.release(u.gather_output);
  }
  done_gathers.push_back(std::move(u.gather));
  if (u.packed_gather) {
    u.packed_gather->wait();
    // Rank-major as the parameters': each part's bytes from every rank's piece, in rank order.
    const torch::Tensor by_rank = u.packed_output.view({n, u.packed_bytes});
    for (PackedPart& p : u.packed) {
      cache.resize_storage(p.full, p.full_nbytes);
      const auto shard_bytes = static_cast<std::int64_t>(p.full_nbytes) / n;
      p.full.variable_data()
          .view({-1})
          .view(torch::kUInt8)
          .view({n, shard_bytes})
          .copy_(by_rank.narrow(1, p.offset, shard_bytes));
    }
    done_gathers.push_back(std::move(u.packed_gather));
    gathered_bytes += static_cast<std::int64_t>(u.packed_output.nbytes());
    cache.release(u.packed_input);
    cache.release(u.packed_output);
  }
  u.state = UnitState::kGathered;
}

void FullyShardedUnits::State::reshard(Unit& u) {
  if (u.state == UnitState::kGathering) wait_gather(u);  // a prefetch nobody used: the collective still ends
  if (u.state != UnitState::kGathered) return;
  for (Param& p : u.params) cache.resize_storage(p.full, 0);
  for (PackedPart& p : u.packed) cache.resize_storage(p.full, 0);
  u.state = UnitState::kSharded;
}

void FullyShardedUnits::State::prefetch_backward_before(int unit) {
  for (int j = unit - 1; j >= 0; --j) {
    Unit& u = units[static_cast<std::size_t>(j)];
    if (u.pre_backward_attached) {
      issue_gather(u);
      return;
    }
  }
}

void FullyShardedUnits::State::finish_reduce() {
  if (!reduce) return;
  PendingReduce r = std::move(*reduce);
  reduce.reset();
  const profile::NvtxRange range("fsdp reduce-scatter");
  r.work->wait();
  done_reduces.push_back(std::move(r.work));
  reduced_bytes += static_cast<std::int64_t>(r.input.nbytes());
  torch::NoGradGuard no_grad;
  if (r.by_rows) {
    r.input = torch::Tensor();  // autograd's block, not the cache's: freed
    if (r.post_divide != 1) r.output.div_(r.post_divide);
    if (r.add_to.defined()) {
      r.add_to.add_(r.output);
      cache.release(r.output);
    }
    return;
  }
  cache.release(r.input);  // before the gradients are made: never held beside them
  if (r.post_divide != 1) r.output.div_(r.post_divide);
  // The shards' gradients are the output's pieces, not copies: each a tensor of its own on the
  // output's storage at its offset (not a view: the optimizer's zero_grad detaches gradients in
  // place, which a view refuses), the block freed when the last of them is dropped. A gradient
  // kept from an earlier micro-batch has the sum added.
  bool held = false;
  std::int64_t offset = 0;
  for (Param& p : r.unit->params) {
    if (!p.shard.requires_grad()) continue;
    const std::vector<std::int64_t> sizes = p.layout.shard_sizes();
    if (p.shard.grad().defined()) {
      p.shard.mutable_grad().add_(r.output.narrow(0, offset, p.layout.shard_numel()).view(sizes));
    } else {
      p.shard.mutable_grad() =
          torch::empty({0}, r.output.options())
              .set_(r.output.storage(), r.output.storage_offset() + offset, sizes, c10::contiguous_strides(sizes));
      held = true;
    }
    offset += p.layout.shard_numel();
  }
  if (held) {
    r.output = torch::Tensor();  // not back into the cache: the gradients hold the block
  } else {
    cache.release(r.output);
  }
}

void FullyShardedUnits::State::post_backward(Unit& u) {
  if (u.post_backward_done) return;
  u.post_backward_done = true;
  // The unit's whole parameters are freed first, then its gradients reduced (FSDP2's
  // post_backward: reshard, then foreach_reduce): a unit's gathered weights and its reduce-scatter
  // input are never held at once.
  reshard(u);
  if (!u.trainable) return;
  if (u.rows_reduced) {  // reduced block by block during its backward
    const std::int64_t blocks = RowGradientBlocks::of(u.params.front().layout).blocks;
    MGBENCH_REQUIRE(!u.params.front().full.grad().defined() && u.next_row_block == blocks, std::logic_error,
                    "FSDP unit {}: its gradient was handed over in {} of {} blocks by rows, or whole as well", u.name,
                    u.next_row_block, blocks);
    return;
  }
  torch::NoGradGuard no_grad;
  PendingReduce r = begin_reduce(u, reduce_scatter_input(u));
  r.output = cache.empty(r.input.numel() / world(), u.options);
  launch_reduce(std::move(r));
}

PendingReduce FullyShardedUnits::State::begin_reduce(Unit& u, torch::Tensor input) {
  const auto [pre, post] = divide_factors(u.options.dtype().toScalarType(), world());
  if (pre != 1) input.div_(pre);
  finish_reduce();  // one reduce-scatter in flight
  PendingReduce r;
  r.unit = &u;
  r.input = std::move(input);
  r.post_divide = post;
  return r;
}

void FullyShardedUnits::State::launch_reduce(PendingReduce r) {
  r.work = comm.reduce_scatter(r.input, r.output, runtime::ReduceOp::kSum);
  reduce = std::move(r);
}

void FullyShardedUnits::State::reduce_rows(Unit& u, std::int64_t block, const torch::Tensor& gradient) {
  torch::NoGradGuard no_grad;
  Param& p = u.params.front();
  const ShardLayout& l = p.layout;
  const RowGradientBlocks blocks = RowGradientBlocks::of(l);
  const int n = world();
  MGBENCH_REQUIRE(u.by_rows && block == (u.rows_reduced ? u.next_row_block : 0) && block < blocks.blocks,
                  std::logic_error, "FSDP unit {}: gradient block {} handed over out of order (of {})", u.name, block,
                  blocks.blocks);
  const std::int64_t rows = blocks.rows_of(block, l);
  MGBENCH_REQUIRE(gradient.is_contiguous() && gradient.numel() == n * rows * l.row_numel &&
                      gradient.scalar_type() == u.options.dtype().toScalarType(),
                  std::logic_error, "FSDP unit {}: gradient block {} is not {} contiguous elements of its dtype",
                  u.name, block, n * rows * l.row_numel);
  if (block == 0) {
    u.rows_reduced = true;
    // The shard's gradient: the blocks' sums written into its rows, or added to an earlier
    // micro-batch's.
    u.rows_added = p.shard.grad().defined();
    if (!u.rows_added) p.shard.mutable_grad() = torch::empty(l.shard_sizes(), u.options);
  }
  u.next_row_block = block + 1;
  PendingReduce r = begin_reduce(u, gradient.view({-1}));
  r.by_rows = true;
  const torch::Tensor rows_of_shard =
      p.shard.grad().view({l.chunk_rows, l.row_numel}).narrow(0, block * blocks.rows, rows).view({-1});
  if (u.rows_added) {
    r.output = cache.empty(rows * l.row_numel, u.options);
    r.add_to = rows_of_shard;
  } else {
    r.output = rows_of_shard;
  }
  launch_reduce(std::move(r));
}

torch::Tensor FullyShardedUnits::State::reduce_scatter_input(Unit& u) {
  const int n = world();
  if (u.in_place) {
    // The gradient is the rank-major input: taken over, not copied (autograd handed it over; the
    // parameter's gradient is dropped as FSDP2 drops the unsharded one).
    Param& p = u.params.front();
    torch::Tensor grad = p.full.grad();
    p.full.mutable_grad() = torch::Tensor();
    if (grad.defined() && grad.is_contiguous()) return grad.view({-1});
    torch::Tensor input = cache.empty(n * p.layout.shard_numel(), u.options);
    if (grad.defined()) return input.copy_(grad.reshape({-1}));
    return input.zero_();
  }
  // The input [rank 0's rows of every gradient][rank 1's]... (FSDP2's foreach_reduce_scatter_copy_in):
  // each gradient's rows copied straight into their places, padding rows zero, a parameter
  // autograd gave no gradient zeros; each whole gradient freed as soon as it is copied.
  std::int64_t numel = 0;
  for (const Param& p : u.params) numel += p.shard.requires_grad() ? p.layout.shard_numel() : 0;
  torch::Tensor input = cache.empty(n * numel, u.options).view({n, numel});
  std::int64_t offset = 0;
  for (Param& p : u.params) {
    if (!p.shard.requires_grad()) continue;
    const ShardLayout& l = p.layout;
    const torch::Tensor grad = p.full.grad().defined() ? p.full.grad().reshape({-1}) : torch::Tensor();
    for (int r = 0; r < n; ++r) {
      const std::int64_t valid = grad.defined() ? l.valid_rows(r) * l.row_numel : 0;
      torch::Tensor slot = input[r].narrow(0, offset, l.shard_numel());
      if (valid > 0) slot.narrow(0, 0, valid).copy_(grad.narrow(0, l.first_row(r) * l.row_numel, valid));
      if (valid < l.shard_numel()) slot.narrow(0, valid, l.shard_numel() - valid).zero_();
    }
    p.full.mutable_grad() = torch::Tensor();
    offset += l.shard_numel();
  }
  return input.view({-1});
}

}  // namespace mgbench::train
