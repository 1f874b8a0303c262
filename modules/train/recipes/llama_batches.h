#pragma once
// Token sequences as the LLM recipes' micro-batches (recipes/sft.cpp, recipes/dpo.cpp): their data
// options, collation -- right-padded rows or sequences packed into one row (--padding) -- with the
// positions whose next token is a target found on the loader thread, and what the loss needs of a
// collated batch (its packing, its sequences, per-sequence sums). TorchTune's padded_collate_sft /
// padded_collate_dpo and get_batch_log_probs.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "core/option_table.h"
#include "data/loader.h"
#include "data/text/sft.h"
#include "models/llama.h"

namespace mgbench::train {

/// How a micro-batch's sequences are laid out (--padding).
enum class Padding {
  kPad,   ///< right-padded to the longest: tokens [R, T] (TorchTune's padded collates; the papers' workload)
  kNone,  ///< packed one after another without padding: tokens [1, S] (models::SequencePacking)
};

/// n tokens padded up to a multiple of `multiple` (>= 1).
inline std::int64_t padded_length(std::int64_t n, std::int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

/// How collate_sequences lays a micro-batch out.
struct Collation {
  std::int64_t pad_id = 0;  // the tokenizer's <|finetune_right_pad_id|>
  Padding padding = Padding::kPad;
  /// The padded length (kPad: T) or the packed row (kNone: S) rounded up to a multiple of this
  /// (--pad-to-multiple; TorchTune's padded_collate_sft pad_to_multiple_of): pad tokens after each
  /// row's sequence, or after the last packed sequence as part of its run (causal attention: no real
  /// token attends to them). 1: the longest sequence, the real tokens.
  std::int64_t pad_to_multiple = 1;
  /// Every batch of one token shape has tensors of one shape and launches the same kernels, as a CUDA
  /// graph's replay needs (RecipeContext::static_shapes): the target list as long as tokens' grid
  /// (R x T, or S), the real targets first and then stand-ins (position 0, label 0, owned by an
  /// extra sequence R that sequence_log_probs drops), and packed runs bounded by S for attention
  /// (PackedRuns::max_length). false: only the real targets (the head computes nothing else), the
  /// runs bounded by the longest.
  bool static_shapes = false;
};

/// Sequences as one batch, as TorchTune's padded_collate_sft / padded_collate_dpo with the targets
/// found here (on the loader thread) instead of in the loss. tensors: tokens int64 [R, T]
/// right-padded with pad_id (kPad; T the longest, rounded up to pad_to_multiple) or [1, S] packed
/// (kNone, S the real tokens, rounded up likewise); the flat indices, in tokens' grid, of the
/// positions whose next label is not masked, int64 [N]; those labels, int64 [N]; each target's
/// sequence, int64 [N] (N = R x T or S with static_shapes, the stand-ins' sequence R); with kNone,
/// each token's position in its sequence, int64 [S], and the runs' cumulative lengths, int32
/// [R + 1] (models::PackedRuns::cu_seqlens: 0, then each sequence's end, the padding counted in the
/// last), and host_tensors {the runs' lengths, int64 [R]; their bound max_length, int64 []}.
/// samples = R; tokens: real tokens; padded_tokens = R x T (kPad) or S (kNone); loss_targets: the
/// real targets. Pinned tensors (pin_memory) but the host one.
data::Batch collate_sequences(const std::vector<const text::TokenizedSample*>& sequences, const Collation& how,
                              bool pin_memory);
/// The packing of a batch collated with Padding::kNone (its tensors possibly on the device), or
/// nullopt for a padded one.
std::optional<models::SequencePacking> packing_of(const data::Batch& batch);
/// The sequences of a collated batch (R).
std::int64_t sequences_of(const data::Batch& batch);
/// Means of per-position values [R, T] (padded) or [1, S] (packed), as tokens, over the positions of
/// the first `first` sequences and over those of the rest: float [2] in values' dtype. Padded: every
/// position of the rows, padding included (TorchTune's DPO means over the padded logits); packed:
/// split where sequence `first` starts, read from the runs' cumulative lengths on the device, the
/// padding after the last sequence counted in the rest's (as a padded row's in its own). No host
/// sync and no host value of the batch but its shapes: a CUDA graph replays it on any batch of the
/// shape. Throws std::invalid_argument unless 0 < first < R and values has tokens' shape.
torch::Tensor split_position_means(const data::Batch& batch, const torch::Tensor& values, std::int64_t first);
/// Per sequence of a collated batch, the sum of its targets' log-probabilities (log_probs: [N], one
/// per target position; a static target list's stand-ins dropped): float32 [R], differentiable.
/// TorchTune's get_batch_log_probs.
torch::Tensor sequence_log_probs(const data::Batch& batch, const torch::Tensor& log_probs);

/// The data options of the LLM recipes (section "Data"), but --dataset, whose table is each recipe's.
struct LlamaDataOptions {
  std::string data;              // local file (.json, .jsonl, .csv, .tsv[.gz])
  std::int64_t max_seq_len = 0;  // 0: no truncation (TorchTune's default)
  bool train_on_input = false;   // the prompt's tokens carry loss too
  std::int64_t limit = 0;        // use the first N rows (0: all)
  Padding padding = Padding::kPad;
  std::int64_t pad_to_multiple = 1;  // Collation::pad_to_multiple

  /// Declares --data, --max-seq-len, --train-on-input, --limit, --padding and --pad-to-multiple. rows:
  /// what a row of the file is ("samples", "preference rows: chosen and rejected"), for the help.
  void declare(options::OptionTable& table, const std::string& rows);
  /// `unlabelled` of the `rows` rows read keep no label token (--max-seq-len cut their responses
  /// off, the prompt masked): all of them, throws DataError naming --data's file, --max-seq-len and
  /// --train-on-input (nothing to train on or evaluate: every step skipped, its loss NaN); some, a warning on
  /// rank 0 (their micro-batches train nothing).
  void refuse_or_warn_unlabelled(int rank, std::size_t unlabelled, std::size_t rows) const;
  /// Throws ConfigError for a --pad-to-multiple or --max-seq-len beyond the model's context
  /// [tokens] (config.json's max_position_embeddings): every micro-batch would be padded past any
  /// position the model has (131,072 on a 256-token model padded each row to 131,072 tokens, and
  /// the kernel killed the rank for its memory), or rows would reach positions it was never
  /// trained at (TorchTune's RoPE cache ends there: its recipes fail on such a row).
  void refuse_beyond_context(std::int64_t context) const;
  /// With --max-seq-len 0 (no cut): `longer` of the rows read are longer than the model's context,
  /// the longest (row `longest_at`, 0-based) `longest` tokens. Throws DataError naming --data's
  /// file, the row and --max-seq-len when longer > 0.
  void refuse_rows_beyond_context(std::int64_t context, std::size_t longer, std::int64_t longest,
                                  std::size_t longest_at) const;
  /// What to warn of when micro-batches are captured as CUDA graphs (static_shapes) with
  /// --pad-to-multiple 1 and --max-seq-len above 1: each length is its own shape, and the shapes
  /// past `max_graphs` run eagerly. "" otherwise.
  std::string graph_shapes_warning(bool static_shapes, int max_graphs) const;
  /// The most tokens a padded row holds: --max-seq-len rounded up to --pad-to-multiple; 0 (unbounded)
  /// without --max-seq-len.
  std::int64_t longest_row() const { return padded_length(max_seq_len, pad_to_multiple); }
};

}  // namespace mgbench::train
