#pragma once
// A model's parameters grouped into the units fully sharded data parallelism (train/parallel/fsdp.h)
// gathers and reshards together -- FSDP2's `fully_shard` groups, as TorchTune's `shard_model` makes
// them: each decoder layer a unit, the token embedding and the output head units of their own
// (`custom_sharded_layers: ['tok_embeddings', 'output']`), the rest (the final norm) the root -- and
// the hooks the model calls around each unit's forward, where FSDP2 registers its pre- and
// post-forward hooks (`FSDPState._pre_forward` / `_post_forward`).
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace mgbench::models {

class RowGradientSink;  // models/row_gradient.h

/// How FSDP2 shards one parameter of shape `sizes` over `world` ranks on dim 0 (a 0-dim
/// parameter counts as one row): torch.chunk's chunks of ceil(rows / world) rows, the last ones
/// shorter or empty, each held padded to that many rows.
struct ShardLayout {
  std::vector<std::int64_t> sizes;  // the whole parameter's
  std::int64_t rows = 1;            // sizes[0]
  std::int64_t row_numel = 1;       // elements per row
  std::int64_t chunk_rows = 1;      // rows each rank holds, padding included
  int world = 1;

  /// Throws std::invalid_argument for world < 1.
  static ShardLayout of(at::IntArrayRef sizes, int world) {
    if (world < 1) throw std::invalid_argument("ShardLayout: world size must be >= 1");
    ShardLayout l;
    l.sizes.assign(sizes.begin(), sizes.end());
    l.world = world;
    l.rows = sizes.empty() ? 1 : sizes[0];
    l.row_numel = 1;
    for (std::size_t d = 1; d < sizes.size(); ++d) l.row_numel *= sizes[d];
    l.chunk_rows = (l.rows + world - 1) / world;  // torch.chunk: ceil(rows / chunks) rows each
    return l;
  }
  /// The first row of rank r's chunk (rows when it is empty).
  std::int64_t first_row(int r) const { return std::min(rows, r * chunk_rows); }
  /// Rows of rank r's chunk that are the parameter's (the rest is padding).
  std::int64_t valid_rows(int r) const { return std::min(rows, (r + 1) * chunk_rows) - first_row(r); }
  std::int64_t shard_numel() const { return chunk_rows * row_numel; }
  /// The shard's shape: [chunk_rows, sizes[1:]...].
  std::vector<std::int64_t> shard_sizes() const {
    std::vector<std::int64_t> s = sizes.empty() ? std::vector<std::int64_t>{1} : sizes;
    s[0] = chunk_rows;
    return s;
  }
};

/// A frozen weight held packed rather than as a parameter (an NF4 base weight: torchao's
/// NF4Tensor), sharded as torchao shards it: each part (packed codes, scalers, factors) split evenly
/// over the ranks in whole quantisation blocks, gathered as bytes.
struct PackedWeight {
  std::string name;                  // its full name ("model.layers.0.self_attn.q_proj.weight")
  std::vector<std::int64_t> shape;   // the weight's, for messages
  std::vector<torch::Tensor> parts;  // the module's own tensors, each splitting into `blocks` equal pieces
  std::int64_t blocks = 1;           // the world size must divide this
};

/// One unit: the parameters gathered and resharded together, in registration order.
struct ParameterUnit {
  std::string name;                       // "model.layers.3", "model.embed_tokens", "root"
  std::vector<std::string> names;         // each parameter's full name (HF's for Llama)
  std::vector<torch::Tensor> parameters;  // the module's own tensors, dense, of one dtype
  std::vector<PackedWeight> packed;       // frozen packed weights (QLoRA's NF4 base), gathered beside them
  /// false: the unit stays gathered from its first forward to the end of backward -- the root and
  /// the last unit of forward, which FSDP2 does not reshard after forward (its backward runs first),
  /// and a unit the forward uses twice (a tied embedding / output head).
  bool reshard_after_forward = true;
  /// false: the unit's backward reads only its inputs and the output's gradient, never its
  /// parameters (an embedding lookup: its weight's gradient is scattered from the token ids), so a
  /// unit freed after forward is not gathered again for backward. FSDP2 gathers every resharded
  /// unit again; this one's whole bytes (a 128k-row embedding) are then saved for backward's peak.
  bool backward_reads_parameters = true;
  /// The times forward enters the unit: 2 for a tied embedding / output head, whose backward then
  /// makes a second whole gradient and sums it into the first (autograd's accumulation).
  int forward_uses = 1;
  /// true: the unit is one weight [V, H] whose backward can hand its gradient over a block of rows
  /// at a time (models/row_gradient.h: an untied token embedding, an untied output head through
  /// target_log_probs), so FSDP reduce-scatters it in blocks and no rank makes the whole gradient.
  bool gradient_by_rows = false;
  /// ... but whole in some steps (a fake-quantised head while its quantisation is on: the gradient
  /// passes its backward first): FSDP's memory and collective arithmetic count it whole.
  bool gradient_whole_at_times = false;
};

/// Called by a model around each unit's forward, in forward order (a unit used twice is entered
/// twice). The identity when not sharded. A model enters the same units in the same order on every
/// rank whatever its input (an empty batch too): under FSDP each entry may gather, a collective.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  /// Before unit `unit` computes on input (its parameters are gathered on return); returns the
  /// input the unit must use (the same values: FSDP attaches its post-backward to it).
  virtual torch::Tensor before_forward(int unit, const torch::Tensor& input) = 0;
  /// After unit `unit` produced output; returns the output to pass on (the same values: FSDP
  /// attaches its pre-backward, the regather, to it).
  virtual torch::Tensor after_forward(int unit, const torch::Tensor& output) = 0;
  /// Where the weight of unit `unit` (one with gradient_by_rows) hands its gradient in this
  /// micro-batch's backward; nullptr: to autograd, whole (the default: unsharded). Not owned; lives
  /// as long as the hooks.
  virtual RowGradientSink* row_gradient_sink(int /*unit*/) { return nullptr; }
};

/// A model the parallelisms of train/parallel/parallelize.h apply to: its units, which FSDP shards
/// and activation checkpointing recomputes, and where it calls the hooks.
class ShardableModel {
 public:
  virtual ~ShardableModel() = default;
  /// Every parameter of the model in exactly one unit, units in forward order.
  virtual std::vector<ParameterUnit> parameter_units() = 0;
  /// hooks: called around each unit's forward from now on (nullptr: none). Not owned.
  virtual void set_unit_hooks(UnitHooks* hooks) = 0;
  /// on: each unit's forward recomputed in backward instead of keeping its activations (torch's
  /// checkpoint_wrapper around each block, as torchtitan's apply_ac and TorchTune's
  /// enable_activation_checkpointing). Throws std::logic_error for on with a model that cannot
  /// (the default): only a recipe whose model can declares the option.
  virtual void set_activation_checkpointing(bool on) {
    if (on) throw std::logic_error("this model has no activation checkpointing");
  }
};

}  // namespace mgbench::models
