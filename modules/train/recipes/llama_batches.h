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

/// Sequences as one batch, as TorchTune's padded_collate_sft / padded_collate_dpo with the targets
/// found here (on the loader thread) instead of in the loss. tensors: tokens int64 [R, T]
/// right-padded with pad_id to the longest (kPad) or [1, S] packed (kNone, S the real tokens); the
/// flat indices, in tokens' grid, of the positions whose next label is not masked, int64 [N]; those
/// labels, int64 [N]; each target's sequence, int64 [N]; with kNone, each token's position in its
/// sequence, int64 [S], and host_tensors {the sequences' lengths, int64 [R]}. samples = R; tokens:
/// real tokens; padded_tokens = R x T (kPad) or S (kNone); loss_targets = N.
data::Batch collate_sequences(const std::vector<const text::TokenizedSample*>& sequences, std::int64_t pad_id,
                              Padding padding, bool pin_memory);
/// The packing of a batch collated with Padding::kNone (its tensors possibly on the device), or
/// nullopt for a padded one.
std::optional<models::SequencePacking> packing_of(const data::Batch& batch);
/// The sequences of a collated batch (R).
std::int64_t sequences_of(const data::Batch& batch);
/// Per sequence of a collated batch, the sum of its targets' log-probabilities (log_probs: [N], one
/// per target position): float32 [R], differentiable. TorchTune's get_batch_log_probs.
torch::Tensor sequence_log_probs(const data::Batch& batch, const torch::Tensor& log_probs);

/// The data options of the LLM recipes (section "Data"), but --dataset, whose table is each recipe's.
struct LlamaDataOptions {
  std::string data;              // local file (.json, .jsonl, .csv, .tsv[.gz])
  std::int64_t max_seq_len = 0;  // 0: no truncation (TorchTune's default)
  bool train_on_input = false;   // the prompt's tokens carry loss too
  std::int64_t limit = 0;        // use the first N rows (0: all)
  Padding padding = Padding::kPad;

  /// Declares --data, --max-seq-len, --train-on-input, --limit and --padding. rows: what a row of the file is
  /// ("samples", "preference rows: chosen and rejected"), for the help.
  void declare(options::OptionTable& table, const std::string& rows);
  /// `unlabelled` of the `rows` rows read keep no label token (--max-seq-len cut their responses
  /// off, the prompt masked): all of them, throws DataError naming --data's file, --max-seq-len and
  /// --train-on-input (nothing to train on or evaluate: every step skipped, its loss NaN); some, a warning on
  /// rank 0 (their micro-batches train nothing).
  void refuse_or_warn_unlabelled(int rank, std::size_t unlabelled, std::size_t rows) const;
};

}  // namespace mgbench::train
