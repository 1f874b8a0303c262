#include "train/recipes/llama_batches.h"

#include <algorithm>
#include <span>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "models/state_dict.h"

namespace mgbench::train {

void LlamaDataOptions::declare(options::OptionTable& t, const std::string& rows) {
  t.add("data", data, "dataset file of " + rows + ": .json (array), .jsonl, .csv, .tsv, optionally .gz")
      .required_to_run()
      .same_workload();
  t.add("max-seq-len", max_seq_len, "truncate each sequence to this many tokens (0: no truncation)").at_least(0);
  t.add("train-on-input", train_on_input, "the prompt's tokens carry loss too (TorchTune's train_on_input)")
      .as_switch()
      .same_workload();
  t.add("limit", limit, "use the first N rows (0: all)").at_least(0);
  static constexpr options::Choice<Padding> kPaddings[] = {
      {"pad", Padding::kPad, "each micro-batch right-padded to its longest sequence (TorchTune, Hugging Face)"},
      {"none", Padding::kNone,
       "each micro-batch's sequences packed without padding, attention within each sequence: the same losses "
       "and gradients, computed on the real tokens only"},
  };
  t.add("padding", padding, std::span<const options::Choice<Padding>>(kPaddings), "how sequences form a micro-batch");
  t.add("pad-to-multiple", pad_to_multiple,
        "pad each micro-batch's length (padded rows, or the packed row) up to a multiple of N tokens "
        "(TorchTune's pad_to_multiple_of): fewer distinct shapes, for --cuda-graphs and the kernels' tiles")
      .at_least(1)
      .at_most(131072);  // Llama 3.1's context: a multiple past it pads every row beyond any model's
}

void LlamaDataOptions::refuse_or_warn_unlabelled(int rank, std::size_t unlabelled, std::size_t rows) const {
  const std::string cut = max_seq_len > 0 ? fmt::format("within --max-seq-len {}", max_seq_len) : "at all";
  MGBENCH_REQUIRE(unlabelled < rows, DataError,
                  "dataset '{}': none of its {} row(s) keeps a label token {}{}: no loss to train on or evaluate "
                  "({}--train-on-input to train on the prompts too)",
                  data, rows, cut, train_on_input ? "" : " (the prompt's tokens carry no loss)",
                  max_seq_len > 0 ? "a longer --max-seq-len, or " : "");
  if (unlabelled > 0 && rank == 0) {
    log::warn("dataset '{}': {} of {} row(s) keep no label token {}: a micro-batch of only those trains nothing", data,
              unlabelled, rows, cut);
  }
}

void LlamaDataOptions::refuse_beyond_context(std::int64_t context) const {
  MGBENCH_REQUIRE(pad_to_multiple <= context, ConfigError,
                  "--pad-to-multiple {} pads every micro-batch to at least {} tokens, past the model's context of {} "
                  "(config.json's max_position_embeddings): expected at most {}",
                  pad_to_multiple, pad_to_multiple, context, context);
  MGBENCH_REQUIRE(max_seq_len <= context, ConfigError,
                  "--max-seq-len {} is past the model's context of {} tokens (config.json's max_position_embeddings): "
                  "positions it was never trained at; expected at most {}",
                  max_seq_len, context, context);
}

void LlamaDataOptions::refuse_rows_beyond_context(std::int64_t context, std::size_t longer, std::int64_t longest,
                                                  std::size_t longest_at) const {
  MGBENCH_REQUIRE(longer == 0, DataError,
                  "dataset '{}': {} row(s) are longer than the model's context of {} tokens (the longest: row {}, {} "
                  "tokens), and --max-seq-len 0 cuts none: give --max-seq-len {} (or less)",
                  data, longer, context, longest_at + 1, longest, context);
}

std::string LlamaDataOptions::graph_shapes_warning(bool static_shapes, int max_graphs) const {
  if (!static_shapes || pad_to_multiple > 1 || max_seq_len == 1) return "";
  return fmt::format(
      "--cuda-graphs with --pad-to-multiple 1: every micro-batch length ({}) is a shape of its own, "
      "captured after its warm-up; past {} shapes the others run eagerly (--pad-to-multiple 64 bounds them)",
      max_seq_len > 0 ? fmt::format("1 to {} tokens", max_seq_len) : std::string("unbounded: --max-seq-len 0"),
      max_graphs);
}

data::Batch collate_sequences(const std::vector<const text::TokenizedSample*>& sequences, const Collation& how,
                              bool pin_memory) {
  std::int64_t longest = 0, total = 0;
  for (const auto* s : sequences) {
    longest = std::max(longest, static_cast<std::int64_t>(s->tokens.size()));
    total += static_cast<std::int64_t>(s->tokens.size());
  }
  const auto rows = static_cast<std::int64_t>(sequences.size());
  const bool packed = how.padding == Padding::kNone;
  const std::int64_t length = padded_length(packed ? total : longest, how.pad_to_multiple);  // S, or T
  const auto options = torch::TensorOptions(torch::kInt64).pinned_memory(pin_memory);
  torch::Tensor tokens = torch::full({packed ? 1 : rows, length}, how.pad_id, options);
  torch::Tensor position_ids = packed ? torch::empty({length}, options) : torch::Tensor();
  std::vector<std::int64_t> lengths;  // packed: each sequence's run, the padding in the last
  std::vector<std::int64_t> positions, targets, owners;
  auto* token_data = tokens.data_ptr<std::int64_t>();
  auto* position_data = packed ? position_ids.data_ptr<std::int64_t>() : nullptr;
  std::int64_t start = 0;  // the sequence's first index in tokens' grid
  data::Batch batch;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto& s = *sequences[static_cast<std::size_t>(r)];
    auto n = static_cast<std::int64_t>(s.tokens.size());
    for (std::int64_t k = 0; k < n; ++k) {
      token_data[start + k] = s.tokens[static_cast<std::size_t>(k)];
      // Position k - 1 predicts token k, where its label is not masked.
      if (k > 0 && s.labels[static_cast<std::size_t>(k)] != text::kIgnoreIndex) {
        positions.push_back(start + k - 1);
        targets.push_back(s.labels[static_cast<std::size_t>(k)]);
        owners.push_back(r);
      }
    }
    batch.tokens += n;
    if (packed) {
      if (r == rows - 1) n = length - start;  // the padding after the last sequence, in its run
      for (std::int64_t k = 0; k < n; ++k) position_data[start + k] = k;
      lengths.push_back(n);
    }
    start += packed ? n : length;
  }
  batch.samples = rows;
  batch.padded_tokens = tokens.numel();
  batch.loss_targets = static_cast<std::int64_t>(positions.size());
  if (how.static_shapes) {
    const auto grid = static_cast<std::size_t>(batch.padded_tokens);
    positions.resize(grid, 0);
    targets.resize(grid, 0);
    owners.resize(grid, rows);
  }
  auto to_tensor = [&](const std::vector<std::int64_t>& values) {
    torch::Tensor t = torch::empty({static_cast<std::int64_t>(values.size())}, options);
    std::copy(values.begin(), values.end(), t.data_ptr<std::int64_t>());
    return t;
  };
  batch.tensors = {std::move(tokens), to_tensor(positions), to_tensor(targets), to_tensor(owners)};
  if (packed) {
    // Attention's bound on a run: the longest, or the row itself where every batch of this shape must
    // launch the same kernels (a graph's replay; flash's blocks past a run's end return at once).
    models::PackedRuns runs = models::PackedRuns::of(std::move(lengths), pin_memory, how.static_shapes ? length : 0);
    batch.tensors.push_back(std::move(position_ids));
    batch.tensors.push_back(std::move(runs.cu_seqlens));
    batch.host_tensors = {torch::tensor(runs.lengths, torch::kInt64), torch::tensor(runs.max_length, torch::kInt64)};
  }
  return batch;
}

namespace {

// Batches collated with Padding::kNone carry the position ids and the runs' cumulative lengths
// (collate_sequences).
bool is_packed(const data::Batch& batch) { return batch.tensors.size() == 6; }

}  // namespace

std::optional<models::SequencePacking> packing_of(const data::Batch& batch) {
  if (!is_packed(batch)) return std::nullopt;
  const torch::Tensor& lengths = batch.host_tensors.at(0);
  const auto* n = lengths.data_ptr<std::int64_t>();
  return models::SequencePacking{batch.tensors[4],
                                 {std::vector<std::int64_t>(n, n + lengths.numel()), batch.tensors[5],
                                  batch.host_tensors.at(1).item<std::int64_t>()}};
}

std::int64_t sequences_of(const data::Batch& batch) {
  return is_packed(batch) ? batch.host_tensors.at(0).numel() : batch.tensors[0].size(0);
}

torch::Tensor split_position_means(const data::Batch& batch, const torch::Tensor& values, std::int64_t first) {
  const std::int64_t rows = sequences_of(batch);
  MGBENCH_REQUIRE(first > 0 && first < rows && values.sizes() == batch.tensors[0].sizes(), std::invalid_argument,
                  "split_position_means: values {} for tokens {}, the first {} of {} sequences",
                  models::shape_text(values.sizes()), models::shape_text(batch.tensors[0].sizes()), first, rows);
  if (!is_packed(batch)) {
    return torch::stack({values.narrow(0, 0, first).mean(), values.narrow(0, first, rows - first).mean()});
  }
  // Split where sequence `first` starts, read on the device: no host value of this batch is baked in.
  const torch::Tensor v = values[0];
  const torch::Tensor split = batch.tensors[5].narrow(0, first, 1);  // int32 [1]
  const torch::Tensor first_sum = v.mul(torch::arange(v.size(0), split.options()).lt(split)).sum();
  const torch::Tensor count = split.squeeze(0).to(v.scalar_type());
  return torch::stack({first_sum / count, (v.sum() - first_sum) / (v.size(0) - count)});
}

torch::Tensor sequence_log_probs(const data::Batch& batch, const torch::Tensor& log_probs) {
  // One bin more than there are sequences: a static target list's stand-ins land in it.
  const std::int64_t rows = sequences_of(batch);
  return torch::zeros({rows + 1}, log_probs.options()).index_add(0, batch.tensors[3], log_probs).narrow(0, 0, rows);
}

}  // namespace mgbench::train
