#include "train/sharding.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "profile/nvtx.h"

namespace mgbench::train {

namespace {

/// Memory of gathered parameters and of the collectives' flat buffers, on the CPU kept for the next
/// unit of the same size instead of freed: with glibc's malloc, the activations allocated between a
/// unit's frees and the next unit's allocations split the freed chunks, and every gather grew the
/// heap (33 MiB a layer of a 146M-parameter model, measured). On a GPU the CUDA caching allocator
/// does this already (FSDP2 relies on it), and blocks go back to it.
class BlockCache {
 public:
  explicit BlockCache(bool enabled) : enabled_(enabled) {}

  /// A block of nbytes: a cached one of that size, else a new one from allocator.
  at::DataPtr take(c10::Allocator* allocator, std::size_t nbytes) {
    if (enabled_) {
      auto it = free_.find(nbytes);
      if (it != free_.end() && !it->second.empty()) {
        at::DataPtr block = std::move(it->second.back());
        it->second.pop_back();
        return block;
      }
    }
    return allocator->allocate(nbytes);
  }
  /// Takes block back (kept when caching, freed otherwise).
  void give(std::size_t nbytes, at::DataPtr block) {
    if (enabled_ && block.get() != nullptr) free_[nbytes].push_back(std::move(block));
  }

  /// A flat tensor of numel elements in a block (uninitialised).
  torch::Tensor empty(std::int64_t numel, const torch::TensorOptions& options) {
    if (!enabled_) return torch::empty({numel}, options);
    const std::size_t nbytes = static_cast<std::size_t>(numel) * options.dtype().itemsize();
    c10::Allocator* allocator = c10::GetAllocator(options.device().type());
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, take(allocator, nbytes), allocator,
                         /*resizable=*/false);
    return torch::empty({0}, options).set_(storage, 0, {numel}, {1});
  }
  /// t's block back into the cache; t is undefined afterwards. Only once nothing reads or writes
  /// it any more (the collective that used it waited for: the communicator's own reference to it,
  /// which it may drop later, then holds an empty storage).
  void release(torch::Tensor& t) {
    if (enabled_ && t.defined()) {
      c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
      const std::size_t nbytes = storage->nbytes();
      give(nbytes, storage->set_data_ptr(at::DataPtr(nullptr, t.device())));
      storage->set_nbytes(0);
    }
    t = torch::Tensor();
  }

  /// Frees (nbytes 0) or re-allocates a tensor's whole storage in place, as FSDP2's
  /// storage().resize_(): the tensor, its views and autograd's saved references keep pointing at it.
  void resize_storage(const torch::Tensor& t, std::size_t nbytes) {
    c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    const std::size_t old = storage->nbytes();
    if (old == nbytes) return;
    give(old, storage->set_data_ptr(take(storage->allocator(), nbytes)));
    storage->set_nbytes(nbytes);
  }

 private:
  bool enabled_;
  std::unordered_map<std::size_t, std::vector<at::DataPtr>> free_;
};

struct Param {
  torch::Tensor full;   // the module's parameter; storage freed while sharded
  torch::Tensor shard;  // [chunk_rows, ...]: this rank's rows, padded
  ShardLayout layout;
  std::int64_t offset = 0;  // in the unit's flat shard
  std::size_t full_nbytes = 0;
};

/// Makes `full` own its whole storage, so that it can be freed and re-allocated in place: a view, an
/// offset or an overlapping layout is replaced by a copy (set_data: modules and optimizers keep the
/// tensor). A dense non-contiguous layout (a channels_last weight) is kept.
void own_whole_storage(torch::Tensor& full) {
  if (full.storage_offset() != 0 || !full.is_non_overlapping_and_dense() || full.storage().nbytes() != full.nbytes()) {
    full.set_data(full.detach().clone(torch::MemoryFormat::Contiguous));
  }
}

/// A part of a frozen packed weight (models::PackedWeight): sharded evenly, as bytes.
struct PackedPart {
  torch::Tensor full;       // the module's tensor; storage freed while sharded
  torch::Tensor shard;      // uint8 [full_nbytes / world]: this rank's bytes
  std::int64_t offset = 0;  // in the unit's packed shard
  std::size_t full_nbytes = 0;
};

enum class UnitState { kSharded, kGathering, kGathered };

struct Unit {
  std::string name;
  std::vector<Param> params;
  bool reshard_after_forward = true;
  std::int64_t flat_numel = 0;  // sum of the shards' numel
  torch::TensorOptions options;
  bool trainable = false;  // some parameter requires grad
  UnitState state = UnitState::kSharded;
  std::unique_ptr<runtime::Work> gather;
  torch::Tensor gather_input, gather_output;
  std::vector<PackedPart> packed;  // frozen packed weights' parts, gathered as bytes beside the parameters
  std::int64_t packed_bytes = 0;   // this rank's packed shard bytes
  std::unique_ptr<runtime::Work> packed_gather;
  torch::Tensor packed_input, packed_output;
  // Per micro-batch (reset by finish_backward):
  bool entered_with_grad = false;      // its post-backward is attached (or left to finish_backward)
  bool pre_backward_attached = false;  // it is regathered in backward
  bool post_backward_done = false;
};

/// A reduce-scatter in flight: its unit's trainable parameters and where their sums land.
struct PendingReduce {
  Unit* unit = nullptr;
  std::unique_ptr<runtime::Work> work;
  torch::Tensor input, output;
  double post_divide = 1;
};

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

struct FullyShardedUnits::State {
  runtime::Communicator& comm;
  bool reshard_after_forward;
  std::vector<Unit> units;
  std::unordered_map<const c10::TensorImpl*, torch::Tensor> shard_by_param;
  std::optional<PendingReduce> reduce;
  BlockCache cache;
  std::vector<std::unique_ptr<runtime::Work>> done_gathers, done_reduces;  // since take_collectives
  std::int64_t gathered_bytes = 0, reduced_bytes = 0;                      // since take_collectives

  int rank() const { return comm.rank(); }
  int world() const { return comm.world_size(); }

  void issue_gather(Unit& u);
  void wait_gather(Unit& u);
  void reshard(Unit& u);
  void post_backward(Unit& u);
  void finish_reduce();
  void prefetch_backward_before(int unit);
};

namespace {

/// The autograd node FSDP attaches in forward, the identity on its tensor; its backward calls into
/// the State: kPre on a unit's output (FSDP2's pre-backward hook: regather the unit), kPost on its
/// input (FSDP2's RegisterPostBackwardFunction: its gradients are complete).
class UnitBoundary : public torch::autograd::Function<UnitBoundary> {
 public:
  enum Kind : std::int64_t { kPre, kPost };
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, std::int64_t state,
                               std::int64_t unit, std::int64_t kind) {
    ctx->saved_data["state"] = state;
    ctx->saved_data["unit"] = unit;
    ctx->saved_data["kind"] = kind;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* s = reinterpret_cast<FullyShardedUnits::State*>(ctx->saved_data["state"].toInt());
    const int unit = static_cast<int>(ctx->saved_data["unit"].toInt());
    if (ctx->saved_data["kind"].toInt() == kPre) {
      s->wait_gather(s->units[static_cast<std::size_t>(unit)]);
    } else {
      s->post_backward(s->units[static_cast<std::size_t>(unit)]);
    }
    s->prefetch_backward_before(unit);
    return {grads[0], torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

void FullyShardedUnits::State::issue_gather(Unit& u) {
  if (u.state != UnitState::kSharded) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> flats;
  flats.reserve(u.params.size());
  for (const Param& p : u.params) flats.push_back(p.shard.detach().reshape({-1}));
  u.gather_input = cache.empty(u.flat_numel, u.options);
  torch::cat_out(u.gather_input, flats);
  u.gather_output = cache.empty(world() * u.flat_numel, u.options);
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

void FullyShardedUnits::State::wait_gather(Unit& u) {
  if (u.state == UnitState::kGathered) return;
  issue_gather(u);
  // Nsight Systems' timeline names FSDP's collectives by these ranges (the kernels are NCCL's own).
  const profile::NvtxRange range("fsdp all-gather");
  u.gather->wait();
  torch::NoGradGuard no_grad;
  const int n = world();
  // The gathered buffer is rank-major: [rank 0's shards][rank 1's shards]...; each parameter's rows
  // are copied out of every rank's piece (FSDP2's foreach_all_gather_copy_out). Written through
  // variable_data(): autograd's version counter stays as forward saved it.
  {
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
  done_gathers.push_back(std::move(u.gather));
  gathered_bytes += static_cast<std::int64_t>(u.gather_output.nbytes());
  cache.release(u.gather_input);
  cache.release(u.gather_output);
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
  torch::NoGradGuard no_grad;
  if (r.post_divide != 1) r.output.div_(r.post_divide);
  std::int64_t offset = 0;
  for (Param& p : r.unit->params) {
    if (!p.shard.requires_grad()) continue;
    const torch::Tensor g = r.output.narrow(0, offset, p.layout.shard_numel()).view(p.layout.shard_sizes());
    offset += p.layout.shard_numel();
    if (p.shard.grad().defined()) {
      p.shard.mutable_grad().add_(g);
    } else {
      // Its own memory: the optimizer's zero_grad detaches gradients in place, which a view refuses.
      p.shard.mutable_grad() = g.clone();
    }
  }
  done_reduces.push_back(std::move(r.work));
  reduced_bytes += static_cast<std::int64_t>(r.input.nbytes());
  cache.release(r.input);
  cache.release(r.output);
}

void FullyShardedUnits::State::post_backward(Unit& u) {
  if (u.post_backward_done) return;
  u.post_backward_done = true;
  if (u.trainable) {
    torch::NoGradGuard no_grad;
    const int n = world();
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
    input = input.view({-1});
    const auto [pre, post] = divide_factors(u.options.dtype().toScalarType(), n);
    if (pre != 1) input.div_(pre);
    finish_reduce();  // one reduce-scatter in flight
    PendingReduce r;
    r.unit = &u;
    r.input = input;
    r.output = cache.empty(input.numel() / n, u.options);
    r.post_divide = post;
    r.work = comm.reduce_scatter(r.input, r.output, runtime::ReduceOp::kSum);
    reduce = std::move(r);
  }
  reshard(u);
}

FullyShardedUnits::FullyShardedUnits(models::ShardableModel& model, runtime::Communicator& comm,
                                     bool reshard_after_forward)
    : state_(
          std::make_unique<State>(State{comm, reshard_after_forward, {}, {}, std::nullopt, BlockCache(false), {}, {}})),
      model_(model) {
  const int world = comm.world_size();
  const int rank = comm.rank();
  torch::NoGradGuard no_grad;
  for (models::ParameterUnit& spec : model.parameter_units()) {
    Unit u;
    u.name = spec.name;
    u.reshard_after_forward = spec.reshard_after_forward;
    for (std::size_t k = 0; k < spec.parameters.size(); ++k) {
      torch::Tensor& full = spec.parameters[k];
      if (k == 0) u.options = full.options().requires_grad(false);
      if (full.scalar_type() != u.options.dtype().toScalarType() || full.device() != u.options.device()) {
        throw std::logic_error(fmt::format("FSDP unit {}: {} is {} on {}, the unit's first parameter {} on {}", u.name,
                                           spec.names[k], c10::toString(full.scalar_type()), full.device().str(),
                                           c10::toString(u.options.dtype().toScalarType()), u.options.device().str()));
      }
      if (state_->shard_by_param.count(full.unsafeGetTensorImpl()) != 0) {
        throw std::logic_error(fmt::format("FSDP: parameter {} is in two units", spec.names[k]));
      }
      // Its memory format stays (a channels_last convolution weight keeps its strides): shards hold
      // rows in their logical order, copied through strided views.
      own_whole_storage(full);
      Param p;
      p.full = full;
      p.layout = ShardLayout::of(full.sizes(), world);
      p.full_nbytes = full.nbytes();
      p.offset = u.flat_numel;
      u.flat_numel += p.layout.shard_numel();
      p.shard = torch::zeros(p.layout.shard_sizes(), u.options);
      const std::int64_t rows = p.layout.valid_rows(rank);
      if (rows > 0) {
        p.shard.view({p.layout.chunk_rows, p.layout.row_numel})
            .narrow(0, 0, rows)
            .copy_(
                full.detach().reshape({p.layout.rows, p.layout.row_numel}).narrow(0, p.layout.first_row(rank), rows));
      }
      p.shard.set_requires_grad(full.requires_grad());
      u.trainable = u.trainable || full.requires_grad();
      state_->shard_by_param.emplace(full.unsafeGetTensorImpl(), p.shard);
      state_->cache.resize_storage(full, 0);
      u.params.push_back(std::move(p));
    }
    for (models::PackedWeight& w : spec.packed) {
      MGBENCH_REQUIRE(
          w.blocks % world == 0, ConfigError,
          "--sharding fsdp over {} ranks: {} [{}] is packed in {} quantisation blocks (NF4), which {} ranks "
          "cannot split evenly (as torchao's NF4Tensor, each rank holds whole blocks, as many as every "
          "other): use a rank count that divides {}, or --sharding none",
          world, w.name, fmt::join(w.shape, ", "), w.blocks, world, w.blocks);
      for (torch::Tensor& full : w.parts) {
        own_whole_storage(full);  // 1-D: contiguous
        PackedPart p;
        p.full = full;
        p.full_nbytes = full.nbytes();
        const auto shard_bytes = static_cast<std::int64_t>(p.full_nbytes) / world;
        p.shard = full.detach().view({-1}).view(torch::kUInt8).narrow(0, rank * shard_bytes, shard_bytes).clone();
        p.offset = u.packed_bytes;
        u.packed_bytes += shard_bytes;
        state_->cache.resize_storage(full, 0);
        u.packed.push_back(std::move(p));
      }
    }
    state_->units.push_back(std::move(u));
  }
  // From here on gathered memory is reused (set up after the sharding: the whole parameters' memory
  // is freed, not kept).
  if (!state_->units.empty()) state_->cache = BlockCache(state_->units.front().options.device().is_cpu());
  model_.set_unit_hooks(this);
}

FullyShardedUnits::~FullyShardedUnits() { model_.set_unit_hooks(nullptr); }

std::vector<torch::Tensor> FullyShardedUnits::trainable_shards() const {
  std::vector<torch::Tensor> out;
  for (const Unit& u : state_->units) {
    for (const Param& p : u.params) {
      if (p.shard.requires_grad()) out.push_back(p.shard);
    }
  }
  return out;
}

torch::Tensor FullyShardedUnits::shard_of(const torch::Tensor& parameter) const {
  const auto it = state_->shard_by_param.find(parameter.unsafeGetTensorImpl());
  return it == state_->shard_by_param.end() ? torch::Tensor() : it->second;
}

torch::Tensor FullyShardedUnits::before_forward(int unit, const torch::Tensor& input) {
  State& s = *state_;
  Unit& u = s.units.at(static_cast<std::size_t>(unit));
  const bool was_gathered = u.state == UnitState::kGathered;
  s.wait_gather(u);
  // Forward prefetch: the next unit's gather runs while this one computes. Not on a second entry
  // of a gathered unit (a tied head): the next unit's forward has already been.
  if (!was_gathered && static_cast<std::size_t>(unit) + 1 < s.units.size()) {
    s.issue_gather(s.units[static_cast<std::size_t>(unit) + 1]);
  }
  if (!torch::GradMode::is_enabled() || u.entered_with_grad) return input;
  u.entered_with_grad = true;
  // The unit's gradients are complete when its input's is (autograd accumulates parameter
  // gradients first): then they are reduce-scattered. An input without a gradient (token ids):
  // finish_backward does it.
  if (!u.trainable || !input.requires_grad()) return input;
  return UnitBoundary::apply(input, reinterpret_cast<std::int64_t>(&s), unit, UnitBoundary::kPost);
}

torch::Tensor FullyShardedUnits::after_forward(int unit, const torch::Tensor& output) {
  State& s = *state_;
  Unit& u = s.units.at(static_cast<std::size_t>(unit));
  if (!s.reshard_after_forward || !u.reshard_after_forward) return output;
  s.reshard(u);
  if (!torch::GradMode::is_enabled() || !output.requires_grad()) return output;
  u.pre_backward_attached = true;
  return UnitBoundary::apply(output, reinterpret_cast<std::int64_t>(&s), unit, UnitBoundary::kPre);
}

void FullyShardedUnits::finish_backward() {
  State& s = *state_;
  for (auto it = s.units.rbegin(); it != s.units.rend(); ++it) {
    if (it->entered_with_grad) s.post_backward(*it);
  }
  s.finish_reduce();
  reshard_all();
  for (Unit& u : s.units) {
    u.entered_with_grad = false;
    u.pre_backward_attached = false;
    u.post_backward_done = false;
  }
}

void FullyShardedUnits::gather_all() {
  for (Unit& u : state_->units) state_->issue_gather(u);
  for (Unit& u : state_->units) state_->wait_gather(u);
}

void FullyShardedUnits::reshard_all() {
  for (Unit& u : state_->units) state_->reshard(u);
}

CollectiveTotals FullyShardedUnits::take_collectives() {
  const auto total = [](std::vector<std::unique_ptr<runtime::Work>>& works) {
    double seconds = 0;
    for (const auto& w : works) seconds += w->seconds_since_start_of(*w);
    works.clear();
    return seconds;
  };
  State& s = *state_;
  CollectiveTotals t{total(s.done_gathers), total(s.done_reduces), s.gathered_bytes, s.reduced_bytes};
  s.gathered_bytes = 0;
  s.reduced_bytes = 0;
  return t;
}

std::int64_t FullyShardedUnits::num_units() const { return static_cast<std::int64_t>(state_->units.size()); }

ShardedMemory FullyShardedUnits::memory() const {
  std::vector<UnitShape> shapes;
  for (const Unit& u : state_->units) {
    UnitShape shape{{}, {}, u.reshard_after_forward, u.packed_bytes * state_->world()};
    for (const Param& p : u.params) {
      shape.sizes.push_back(p.layout.sizes);
      shape.trainable.push_back(p.shard.requires_grad());
    }
    shapes.push_back(std::move(shape));
  }
  const std::int64_t element = state_->units.empty() ? 0 : state_->units.front().options.dtype().itemsize();
  return sharded_memory(shapes, state_->world(), element, state_->reshard_after_forward);
}

}  // namespace mgbench::train
