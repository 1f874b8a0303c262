// The Llama component's memory plan (`mgbench llm --dry-run`) and its checks of the model against
// the device's memory before anything is allocated.
#include "train/recipes/llama_finetune.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "models/log_probs.h"
#include "runtime/device.h"
#include "train/optim/optimizer.h"
#include "train/parallel/shard_layout.h"

namespace mgbench::train {
namespace {

namespace fs = std::filesystem;

/// The memory a plan is measured against: the rank's GPU, or on the CPU its share of the host
/// memory (RecipeContext::host_memory); bytes <= 0: unknown.
struct RankMemory {
  double bytes = 0;
  std::string source;       // what limits host memory ("" on a GPU)
  int ranks_on_device = 1;  // on a GPU: the ranks sharing it (bytes is this rank's share)
  /// "this rank's GPU has 79.1 GiB", "this rank's share of its GPU (1 of 2 ranks) has 69.9 GiB",
  /// "this rank's host memory has 12.0 GiB (physical memory, ...)".
  std::string text() const {
    const std::string what = !source.empty()        ? "host memory"
                             : ranks_on_device == 1 ? "GPU"
                                                    : fmt::format("share of its GPU (1 of {} ranks)", ranks_on_device);
    return fmt::format("this rank's {} has {:.1f} GiB{}", what, bytes / (1 << 30),
                       source.empty() ? std::string() : fmt::format(" ({})", source));
  }
};

RankMemory rank_memory(const RecipeContext& ctx) {
  if (ctx.placement.is_cuda()) {
    const int sharing = std::max(1, ctx.placement.ranks_on_device);
    return {static_cast<double>(runtime::cuda_total_memory(ctx.placement.index)) / sharing, "", sharing};
  }
  return {static_cast<double>(ctx.host_memory.bytes), ctx.host_memory.source};
}

}  // namespace

std::vector<UnitShape> LlamaFinetune::unit_shapes(const models::LlamaConfig& c, std::int64_t element_bytes) const {
  const std::int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const std::int64_t f = c.intermediate_size;
  const bool full = finetune_ == Finetune::kFull;
  const bool nf4 = base_ == models::BaseWeights::kNf4;
  std::vector<std::string> targets;
  if (!full) targets = lora_.hf_targets();
  const auto dense = [full](UnitShape& u, std::vector<std::int64_t> sizes) {
    u.sizes.push_back(std::move(sizes));
    u.trainable.push_back(full);
  };
  // A projection [out, in]: its dense weight (NF4: packed, not a parameter) and LoRA's A, B.
  const auto projection = [&](UnitShape& u, const std::string& name, std::int64_t out, std::int64_t in) {
    if (nf4) {
      u.packed_bytes += models::Nf4Weight::sharded_nbytes(out * in, element_bytes);
    } else {
      dense(u, {out, in});
    }
    if (std::find(targets.begin(), targets.end(), name) != targets.end()) {
      u.sizes.push_back({lora_.rank, in});
      u.sizes.push_back({out, lora_.rank});
      u.trainable.insert(u.trainable.end(), {true, true});
    }
  };
  std::vector<UnitShape> units;
  UnitShape embedding{{}, {}, !c.tie_word_embeddings};
  embedding.backward_reads_parameters = c.tie_word_embeddings;
  embedding.forward_uses = c.tie_word_embeddings ? 2 : 1;
  embedding.gradient_by_rows = !c.tie_word_embeddings;  // LlamaForCausalLMImpl::parameter_units' flags
  dense(embedding, {c.vocab_size, h});
  units.push_back(embedding);
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    UnitShape layer;
    dense(layer, {h});
    projection(layer, "q_proj", q, h);
    projection(layer, "k_proj", kv, h);
    projection(layer, "v_proj", kv, h);
    projection(layer, "o_proj", h, q);
    dense(layer, {h});
    projection(layer, "gate_proj", f, h);
    projection(layer, "up_proj", f, h);
    projection(layer, "down_proj", h, f);
    units.push_back(std::move(layer));
  }
  UnitShape root{{}, {}, false};
  dense(root, {h});
  units.push_back(root);
  if (!c.tie_word_embeddings) {
    UnitShape head{{}, {}, false};
    // Full QAT fake-quantises the head when the group divides its in-features (enable_fake_quant):
    // its gradient then passes through the quantisation's backward, whole, once that is on.
    head.gradient_by_rows = true;
    head.gradient_whole_at_times = full && fake_quant_ != FakeQuant::kNone && h % qat_group_size_ == 0;
    dense(head, {c.vocab_size, h});
    units.push_back(head);
  }
  return units;
}

std::int64_t LlamaFinetune::activation_bytes(const MicroBatchShape& micro_batch, std::int64_t element_bytes) const {
  if (micro_batch.tokens <= 0) return -1;
  const models::LlamaConfig c = read_config();
  const std::int64_t positions = micro_batch.sequences * micro_batch.tokens;  // B x T
  const std::int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const std::int64_t layer = positions * (4 * c.hidden_size + 2 * q + 2 * kv + 4 * c.intermediate_size) * element_bytes;
  const std::int64_t layer_input = positions * c.hidden_size * element_bytes;
  const std::int64_t layers =
      activation_checkpointing_ ? c.num_hidden_layers * layer_input + layer : c.num_hidden_layers * layer;
  const std::int64_t head = 2 * 4 * std::min(positions * c.vocab_size, models::kLogitsChunkElements) + layer_input;
  return layers + head;
}

ModelStepShape LlamaFinetune::model_step_shape(const TrainOptions& train, double attended_per_position) const {
  const models::LlamaConfig c = read_config();
  const auto element =
      static_cast<std::int64_t>(axes::dtype_info(axes::precision_info(train.precision).param_dtype).bytes);
  const std::vector<UnitShape> units = unit_shapes(c, element);
  ModelStepShape shape;
  shape.flops_per_position = flops_of(c, 1.0, attended_per_position);
  for (const UnitShape& u : units) {
    for (std::size_t i = 0; i < u.sizes.size(); ++i) {
      if (!u.trainable[i]) continue;
      std::int64_t elements = 1;
      for (const std::int64_t d : u.sizes[i]) elements *= d;
      shape.trainable_parameters += elements;
    }
  }
  const MicroBatchCollectives collectives = micro_batch_collectives(
      units, 1, element, train.parallel_plan(1, activation_checkpointing_).reshard_after_forward);
  shape.allgather_bytes = collectives.all_gather_bytes;
  shape.reducescatter_bytes = collectives.reduce_scatter_bytes;
  return shape;
}

std::vector<MemoryPlanRow> LlamaFinetune::memory_plan(const TrainOptions& train, const std::vector<int>& world_sizes,
                                                      const MicroBatchShape& micro_batch) const {
  const models::LlamaConfig c = read_config();
  const axes::PrecisionInfo& precision = axes::precision_info(train.precision);
  const auto element = static_cast<std::int64_t>(axes::dtype_info(precision.param_dtype).bytes);
  const std::vector<UnitShape> units = unit_shapes(c, element);
  const std::int64_t activations = activation_bytes(
      micro_batch, static_cast<std::int64_t>(
                       axes::dtype_info(precision.autocast ? precision.autocast_dtype : precision.param_dtype).bytes));
  const std::int64_t states = optimizer_states_per_element(train.optim);
  std::vector<MemoryPlanRow> rows;
  for (const int world : world_sizes) {
    const axes::ParallelPlan plan = train.parallel_plan(world, activation_checkpointing_);
    const bool sharded = plan.fully_sharded();
    const ShardedMemory m = sharded_memory(units, plan.shard_world(), element, plan.reshard_after_forward);
    MemoryPlanRow row{world,
                      sharded,
                      sharded ? m.shard_bytes + m.gathered_peak_bytes : m.shard_bytes,
                      gradient_bytes_per_rank(plan, train.gradient_as_bucket_view, m.trainable_shard_bytes,
                                              m.whole_gradient_peak_bytes),
                      states * m.trainable_shard_bytes,
                      activations};
    rows.push_back(row);
  }
  return rows;
}

void LlamaFinetune::refuse_if_weights_do_not_fit(const RecipeContext& ctx) const {
  // The weights alone (NF4 projections at their lower bound of half a byte a parameter), against
  // the device's memory: a config.json with absurd sizes is refused here, not minutes into allocating.
  // Cut to shards as it is built (a fully sharded plan), a rank holds 1/N of them.
  const double parameters = static_cast<double>(config_->num_parameters());
  const int shards = ctx.sharder != nullptr ? ctx.plan.shard_world() : 1;
  const double bytes =
      parameters / shards *
      (base_ == models::BaseWeights::kNf4 ? 0.5
                                          : static_cast<double>(axes::dtype_info(ctx.precision.param_dtype).bytes));
  const RankMemory memory = rank_memory(ctx);
  const fs::path where = fs::is_directory(model_name_) ? fs::path(model_name_) / "config.json" : fs::path(model_name_);
  MGBENCH_REQUIRE(memory.bytes <= 0 || bytes <= memory.bytes, DataError,
                  "model '{}' (hidden_size {}, intermediate_size {}, num_hidden_layers {}, vocab_size {}): {:.3g} "
                  "parameters need at least {:.1f} GiB for the weights alone{}, and {}",
                  where.string(), config_->hidden_size, config_->intermediate_size, config_->num_hidden_layers,
                  config_->vocab_size, parameters, bytes / (1 << 30),
                  shards > 1 ? fmt::format(" (a 1/{} shard of them per rank)", shards) : std::string(), memory.text());
}

void LlamaFinetune::refuse_if_plan_does_not_fit(const RecipeContext& ctx) const {
  const RankMemory device = rank_memory(ctx);
  if (device.bytes <= 0) return;
  // The model's state alone at this world size -- weights (under fsdp the shards and the units
  // gathered at once), gradients and optimizer states, as the run's attributes will record them;
  // activations come on top and are not counted here (an estimate, `--dry-run` prints it).
  const MemoryPlanRow row = memory_plan(ctx.train, {ctx.plan.world}, {})[0];
  if (static_cast<double>(row.total_bytes()) <= device.bytes) return;
  TrainOptions sharded = ctx.train;
  sharded.sharding = axes::Sharding::kFsdp;
  const std::optional<int> fits = fewest_ranks_that_fit([&](int world) { return memory_plan(sharded, {world}, {})[0]; },
                                                        std::max(2, ctx.plan.world * 2), device.bytes);
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  throw ConfigError(fmt::format(
      "{} ({:.2f}B parameters, --precision {}): at {} rank(s) ({}) each rank holds {:.1f} GiB for parameters "
      "{:.1f}, gradients {:.1f} and optimizer states {:.1f} GiB before activations, and {}; {} "
      "(mgbench llm --dry-run --ranks N prints the plan)",
      model_name_, static_cast<double>(config_->num_parameters()) / 1e9, axes::precision_info(ctx.train.precision).name,
      ctx.plan.world, ctx.plan.fully_sharded() ? "fsdp" : "each a replica",
      static_cast<double>(row.total_bytes()) / kGiB, static_cast<double>(row.parameter_bytes) / kGiB,
      static_cast<double>(row.gradient_bytes) / kGiB, static_cast<double>(row.optimizer_state_bytes) / kGiB,
      device.text(),
      fits ? fmt::format("with --sharding fsdp it fits from {} ranks", *fits)
           : std::string("no rank count up to 4096 fits: LoRA or QLoRA, or a smaller model")));
}

}  // namespace mgbench::train
