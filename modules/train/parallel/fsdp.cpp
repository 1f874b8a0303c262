#include "train/parallel/fsdp.h"

#include <algorithm>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "train/parallel/fsdp_units.h"
#include "train/parallel/unit_sharder.h"

namespace mgbench::train {
namespace {

using fsdp::BlockCache;
using fsdp::PackedPart;
using fsdp::Param;
using fsdp::Unit;
using fsdp::UnitState;

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

/// A unit's RowGradientSink: each block reduce-scattered as it is handed over (State::reduce_rows).
class RowReducer final : public models::RowGradientSink {
 public:
  RowReducer(FullyShardedUnits::State& state, std::size_t unit) : state_(state), unit_(unit) {}

  std::int64_t blocks() const override { return RowGradientBlocks::of(layout()).blocks; }
  std::vector<models::RowRange> block(std::int64_t b) const override {
    const ShardLayout& l = layout();
    const RowGradientBlocks blocks = RowGradientBlocks::of(l);
    std::vector<models::RowRange> rows;
    for (int r = 0; r < l.world; ++r) rows.push_back({l.first_row(r) + b * blocks.rows, blocks.rows_of(b, l)});
    return rows;
  }
  void take(std::int64_t b, torch::Tensor gradient) override { state_.reduce_rows(state_.units[unit_], b, gradient); }

 private:
  const ShardLayout& layout() const { return state_.units[unit_].params.front().layout; }
  FullyShardedUnits::State& state_;
  std::size_t unit_;
};

}  // namespace

FullyShardedUnits::FullyShardedUnits(models::ShardableModel& model, runtime::Communicator& comm,
                                     bool reshard_after_forward, UnitSharder* cut_at_build)
    : state_(
          std::make_unique<State>(State{comm, reshard_after_forward, {}, {}, std::nullopt, BlockCache(false), {}, {}})),
      model_(model) {
  const int world = comm.world_size();
  const int rank = comm.rank();
  MGBENCH_REQUIRE(cut_at_build == nullptr || (cut_at_build->rank() == rank && cut_at_build->world_size() == world),
                  std::logic_error, "FSDP: shards cut at build for rank {} of {}, this is rank {} of {}",
                  cut_at_build->rank(), cut_at_build->world_size(), rank, world);
  // The shards a sharded build cut (UnitSharder) are taken as they are; the rest are cut here, by
  // the same sharder.
  UnitSharder here(rank, world);
  UnitSharder& cutter = cut_at_build != nullptr ? *cut_at_build : here;
  torch::NoGradGuard no_grad;
  for (models::ParameterUnit& spec : model.parameter_units()) {
    Unit u;
    u.name = spec.name;
    u.reshard_after_forward = spec.reshard_after_forward;
    u.backward_reads_parameters = spec.backward_reads_parameters;
    u.forward_uses = spec.forward_uses;
    for (std::size_t k = 0; k < spec.parameters.size(); ++k) {
      const torch::Tensor& full = spec.parameters[k];
      if (k == 0) u.options = full.options().requires_grad(false);
      if (full.scalar_type() != u.options.dtype().toScalarType() || full.device() != u.options.device()) {
        throw std::logic_error(fmt::format("FSDP unit {}: {} is {} on {}, the unit's first parameter {} on {}", u.name,
                                           spec.names[k], c10::toString(full.scalar_type()), full.device().str(),
                                           c10::toString(u.options.dtype().toScalarType()), u.options.device().str()));
      }
      // Before anything is cut: a tensor cut for one unit must not be cut again for another.
      if (!state_->shard_by_param.emplace(full.unsafeGetTensorImpl(), torch::Tensor()).second) {
        throw std::logic_error(fmt::format("FSDP: parameter {} is in two units", spec.names[k]));
      }
    }
    cutter.shard(spec);  // a no-op for a unit cut at build
    for (const torch::Tensor& full : spec.parameters) {
      Param p;
      p.full = full;
      p.layout = ShardLayout::of(full.sizes(), world);
      p.full_nbytes = full.nbytes();
      p.offset = u.flat_numel;
      u.flat_numel += p.layout.shard_numel();
      p.shard = cutter.take(full);
      p.shard.set_requires_grad(full.requires_grad());
      u.trainable = u.trainable || full.requires_grad();
      state_->shard_by_param[full.unsafeGetTensorImpl()] = p.shard;
      u.params.push_back(std::move(p));
    }
    if (u.params.size() == 1 && spec.packed.empty()) {
      const Param& only = u.params.front();
      u.in_place =
          only.full.is_contiguous() && only.shard.is_contiguous() && only.layout.chunk_rows * world == only.layout.rows;
    }
    for (const models::PackedWeight& w : spec.packed) {
      for (const torch::Tensor& full : w.parts) {
        PackedPart p;
        p.full = full;
        p.full_nbytes = full.nbytes();
        p.shard = cutter.take(full);
        p.offset = u.packed_bytes;
        u.packed_bytes += static_cast<std::int64_t>(p.full_nbytes) / world;
        u.packed.push_back(std::move(p));
      }
    }
    if (u.in_place) {  // one contiguous weight, nothing packed
      const UnitShape shape{{u.params.front().layout.sizes},
                            {u.trainable},
                            u.reshard_after_forward,
                            0,
                            true,
                            u.forward_uses,
                            spec.gradient_by_rows,
                            spec.gradient_whole_at_times};
      u.by_rows = reduced_by_row_blocks(shape, world, /*always=*/false);
      u.by_rows_always = reduced_by_row_blocks(shape, world);
      if (u.by_rows) u.sink = std::make_unique<RowReducer>(*state_, state_->units.size());
    }
    state_->units.push_back(std::move(u));
  }
  MGBENCH_REQUIRE(cutter.pending() == 0, std::logic_error,
                  "FSDP: {} shard(s) cut at build belong to no parameter of the model's units", cutter.pending());
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
  if (!torch::GradMode::is_enabled() || !output.requires_grad() || !u.backward_reads_parameters) return output;
  u.pre_backward_attached = true;
  return UnitBoundary::apply(output, reinterpret_cast<std::int64_t>(&s), unit, UnitBoundary::kPre);
}

models::RowGradientSink* FullyShardedUnits::row_gradient_sink(int unit) {
  return state_->units.at(static_cast<std::size_t>(unit)).sink.get();
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
    u.rows_reduced = false;
    u.next_row_block = 0;
  }
}

void FullyShardedUnits::gather_all() {
  for (Unit& u : state_->units) state_->issue_gather(u);
  for (Unit& u : state_->units) state_->wait_gather(u);
}

void FullyShardedUnits::reshard_all() {
  for (Unit& u : state_->units) state_->reshard(u);
}

void FullyShardedUnits::for_each_unit_gathered(
    const std::function<void(const std::vector<torch::Tensor>& parameters)>& fn) {
  State& s = *state_;
  for (std::size_t i = 0; i < s.units.size(); ++i) {
    Unit& u = s.units[i];
    s.issue_gather(u);
    s.wait_gather(u);
    if (i + 1 < s.units.size()) s.issue_gather(s.units[i + 1]);
    std::vector<torch::Tensor> parameters;
    for (const Param& p : u.params) parameters.push_back(p.full);
    fn(parameters);
    s.reshard(u);
  }
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
    UnitShape shape{{},
                    {},
                    u.reshard_after_forward,
                    u.packed_bytes * state_->world(),
                    u.backward_reads_parameters,
                    u.forward_uses,
                    u.by_rows,
                    !u.by_rows_always};
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
