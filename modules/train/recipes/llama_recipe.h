#pragma once
// The base of the recipes on the Llama component (recipes/sft.cpp, recipes/dpo.cpp): the Recipe
// members that are the component's own (llama_finetune.h) and the data options and set-up both share.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "core/error.h"
#include "core/log.h"
#include "core/option_table.h"
#include "train/recipe.h"
#include "train/recipes/llama_batches.h"
#include "train/recipes/llama_finetune.h"
#include "train/step_graphs.h"

namespace mgbench::train {

/// A recipe on the Llama component (sft.cpp, dpo.cpp): the Recipe members that are the component's
/// own -- the model, what is trained and checkpointed, the step hook that switches fake
/// quantisation on, token counting -- and the data options and set-up both share. A recipe adds its
/// dataset table, loss, evaluation and records.
class LlamaRecipe : public Recipe {
 public:
  torch::nn::Module& model() override { return llama_.model(); }
  models::ShardableModel* shardable_model() override { return &llama_.model(); }
  std::vector<MemoryPlanRow> memory_plan(const TrainOptions& train,
                                         const std::vector<int>& world_sizes) const override {
    return llama_.memory_plan(train, world_sizes, {train.batch_size * sequences_per_row(), data_.longest_row()});
  }
  /// A sample's padded tokens are sequences_per_row() sequences' (a preference pair: two).
  std::optional<ModelStepShape> model_step_shape(const TrainOptions& train,
                                                 double padded_tokens_per_sample) const override {
    return llama_.model_step_shape(train, padded_tokens_per_sample / static_cast<double>(sequences_per_row()));
  }
  std::vector<torch::Tensor> trainable_parameters() override { return llama_.trainable(); }
  std::vector<std::pair<std::string, torch::Tensor>> checkpoint_tensors() override {
    return llama_.checkpoint_tensors();
  }
  bool activation_checkpointing() const override { return llama_.activation_checkpointing(); }
  bool begin_step(std::int64_t global_step) override { return llama_.begin_step(global_step); }
  std::string steps_warning(std::int64_t optimizer_steps) const override {
    return llama_.steps_warning(optimizer_steps);
  }
  bool counts_tokens() const override { return true; }
  /// Micro-batches on a model without random draws in its recomputation can be captured: their
  /// target lists are then laid out at a fixed length and packed runs bounded by the row
  /// (Collation::static_shapes), the normaliser is the host's (Recipe::loss_normalizer). Packed ones
  /// need flash attention's one call for all their sequences, which takes bf16 (docs/design.md, CUDA
  /// graphs).
  std::string graph_blocker(const TrainOptions& train) const override {
    if (data_.padding == Padding::kNone && train.precision == axes::Precision::kFp32) {
      return "--padding none with --precision fp32: packed sequences' attention runs one call per sequence on "
             "the host's lengths (flash attention, one call for them all, takes bf16; --padding pad allows "
             "graphs in fp32)";
    }
    return llama_.graph_blocker();
  }

 protected:
  /// Declares the model's options (LlamaFinetune::declare), then section "Data": --dataset, a name of
  /// `rows` (the recipe's templates or formats), and the LlamaDataOptions (file_rows: what a row of
  /// the file is, for the help).
  template <typename Row>
  void declare_model_and_data(options::OptionTable& t, options::ValueOf<Row>& dataset, std::span<const Row> rows,
                              const std::string& dataset_help, const std::string& file_rows) {
    llama_.declare(t);
    t.section("Data");
    t.add("dataset", dataset, rows, dataset_help);
    data_.declare(t, file_rows);
  }

  /// The set-up of an LLM recipe: the tokenizer, the rows `load(tokenizer)` reads from --data (the
  /// first --limit of them), then the model (LlamaFinetune::build). Throws DataError naming the
  /// file when no row is left, a row is longer than the model's context (--max-seq-len 0), or no
  /// row keeps a label token within --max-seq-len (nothing would train: every step skipped, every
  /// loss NaN); ConfigError for --max-seq-len or --pad-to-multiple past the context; and what
  /// loading and building throw; warns (rank 0) of the rows that keep none.
  template <typename Rows, typename Load>
  void setup_rows(const RecipeContext& ctx, Rows& rows, Load&& load) {
    llama_.load_tokenizer();
    if (const std::string warning = llama_.special_tokens_warning(); !warning.empty() && ctx.rank == 0) {
      log::warn("{}", warning);
    }
    data_.refuse_beyond_context(llama_.context_length());
    llama_.prepare_output_dir();
    rows = load(llama_.tokenizer());
    if (data_.limit > 0 && static_cast<std::int64_t>(rows.size()) > data_.limit) {
      rows.resize(static_cast<std::size_t>(data_.limit));
    }
    MGBENCH_REQUIRE(!rows.empty(), DataError, "dataset '{}': no rows", data_.data);
    std::size_t longer = 0, longest_at = 0;
    std::int64_t longest = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const std::int64_t tokens = sequence_tokens(rows[i]);  // text::
      longer += tokens > llama_.context_length() ? 1 : 0;
      if (tokens > longest) {
        longest = tokens;
        longest_at = i;
      }
    }
    data_.refuse_rows_beyond_context(llama_.context_length(), longer, longest, longest_at);
    const auto unlabelled = static_cast<std::size_t>(
        std::count_if(rows.begin(), rows.end(), [](const auto& row) { return label_tokens(row) == 0; }));  // text::
    data_.refuse_or_warn_unlabelled(ctx.rank, unlabelled, rows.size());
    static_shapes_ = ctx.static_shapes;
    if (const std::string warning = data_.graph_shapes_warning(static_shapes_, MicroBatchGraphs::kMaxGraphs);
        !warning.empty() && ctx.rank == 0) {
      log::warn("{}", warning);
    }
    llama_.build(ctx);
  }

  /// The sequences as one micro-batch (collate_sequences) as the data options and the loop's graphs ask.
  data::Batch collate(const std::vector<const text::TokenizedSample*>& sequences, bool pin_memory) const {
    return collate_sequences(
        sequences, {llama_.tokenizer().pad_id(), data_.padding, data_.pad_to_multiple, static_shapes_}, pin_memory);
  }

  /// Sequences a row of the dataset makes in a batch: 1 (a sample), 2 for a preference pair.
  virtual std::int64_t sequences_per_row() const { return 1; }

  LlamaFinetune llama_;
  LlamaDataOptions data_;

 private:
  bool static_shapes_ = false;  // RecipeContext::static_shapes
};

}  // namespace mgbench::train
