// Supervised fine-tuning of Llama 3 on instruction data -- the recipes lora, qlora, full, qat and
// qat-lora of recipes/table.cpp, which differ only in their defaults (Lawenda et al. 2025, sec. 4; the
// second paper, arXiv 2505.22905, compares LoRA, QLoRA and QAT) -- with TorchTune 0.6's
// lora_finetune_distributed / full_finetune_distributed / qat_distributed /
// qat_lora_finetune_distributed semantics:
//  - samples: the dataset's rows through TorchTune's templates and masks (data/text/sft.h),
//    padded per micro-batch (tokens with <|finetune_right_pad_id|>); the loss targets (the next
//    token where the label is not masked) are found on the loader thread;
//  - loss: cross-entropy of the next token, summed over the targets; the loop divides the
//    gradient by the targets of the whole step on all ranks (TorchTune's token normalisation);
//  - the model and what is trained (LoRA adapters over a dense or NF4 base, or every parameter;
//    8da4w fake quantisation): train/recipes/llama_finetune.h, shared with the DPO recipe; written at the
//    end to --output-dir.
// --eval-only: the token-weighted mean cross-entropy of the dataset ("eval loss: <value>"),
// with an adapter from --adapter.
#include <filesystem>

#include "core/error.h"
#include "data/text/sft.h"
#include "train/recipe.h"
#include "train/recipes/llama_recipe.h"

namespace mgbench::train {
namespace {

namespace fs = std::filesystem;

struct SftOptions {
  text::DatasetKind dataset = text::DatasetKind::kAlpaca;
  bool eval_only = false;
  std::string adapter;  // --eval-only: a PEFT adapter directory to load
};

class SftRecipe final : public LlamaRecipe {
 public:
  void declare(options::OptionTable& t) override {
    auto& o = options_;
    declare_model_and_data(t, o.dataset, text::dataset_choices(), "the dataset's template", "instruction samples");
    t.section("Evaluation");
    t.add("eval-only", o.eval_only, "print `eval loss: <value>` (token-weighted cross-entropy of --data) and exit")
        .as_switch();
    t.add("adapter", o.adapter, "--eval-only: the PEFT adapter directory to load")
        .only_with([&o] { return o.eval_only; }, "--eval-only");
    t.only_with(
        "output-dir", [&o] { return !o.eval_only; }, "a training run (--eval-only writes nothing)");
  }

  void validate(const TrainOptions& train) const override { llama_.validate(train, "fine-tuning"); }

  void setup(const RecipeContext& ctx) override {
    const auto& o = options_;
    setup_rows(ctx, samples_, [&](const text::Llama3Tokenizer& tokenizer) {
      return text::load_sft_dataset(data_.data, tokenizer, {o.dataset, data_.max_seq_len, data_.train_on_input});
    });
    if (o.eval_only && !o.adapter.empty()) llama_.load_adapter(o.adapter);
  }

  std::int64_t train_size() const override { return static_cast<std::int64_t>(samples_.size()); }

  /// LlamaFinetune::collate of the planned rows (tokens, target positions, targets).
  data::Batch assemble(const data::PlannedBatch& plan, bool pin_memory) const override {
    return collate(plan.indices, pin_memory);
  }

  LossNormalization loss_normalization() const override { return LossNormalization::kSumOverTargets; }

  /// The next-token cross-entropy summed over the batch's targets (fp32; only target positions
  /// reach the output projection), over its sequences (a static target list's stand-ins dropped).
  MicroBatchLoss forward(const data::Batch& batch) override { return {-target_sum(batch), {}}; }

  double flops(const data::Batch& batch) const override { return llama_.flops(batch); }

  std::int64_t eval_size() const override { return options_.eval_only ? train_size() : 0; }
  data::Batch assemble_eval(const std::vector<std::int64_t>& indices) const override {
    return collate(indices, /*pin_memory=*/false);
  }
  std::int64_t eval_terms() const override { return 2; }
  torch::Tensor eval_sums(const data::Batch& batch) override {
    const torch::Tensor loss = (-target_sum(batch)).to(torch::kFloat64);
    return torch::stack({loss, torch::full({}, static_cast<double>(batch.loss_targets), loss.options())});
  }
  EvalResult eval_result(const torch::Tensor& sums) const override {
    const double targets = sums[1].item<double>();
    MGBENCH_REQUIRE(targets > 0, DataError, "dataset '{}': no label tokens to evaluate", data_.data);
    EvalResult r;
    r.loss = sums[0].item<double>() / targets;
    return r;
  }
  bool eval_only() const override { return options_.eval_only; }

  h5::Attributes attributes() const override {
    h5::Attributes a = llama_.attributes();
    a.emplace_back("train_samples", static_cast<std::int64_t>(samples_.size()));
    return a;
  }

  std::vector<TensorExport> tensor_exports() const override {
    return options_.eval_only ? std::vector<TensorExport>{} : llama_.exports();
  }
  void finish(int rank) override {
    if (rank == 0 && !options_.eval_only) llama_.save();
  }

 private:
  data::Batch collate(const std::vector<std::int64_t>& indices, bool pin_memory) const {
    std::vector<const text::TokenizedSample*> rows;
    for (const auto i : indices) rows.push_back(&samples_[static_cast<std::size_t>(i)]);
    return LlamaRecipe::collate(rows, pin_memory);
  }
  /// The sum of the log-probabilities of the batch's targets: a scalar, fp32.
  torch::Tensor target_sum(const data::Batch& batch) {
    return sequence_log_probs(batch, llama_.target_log_probs(batch).log_probs).sum();
  }

  SftOptions options_;
  std::vector<text::TokenizedSample> samples_;
};

}  // namespace

std::unique_ptr<Recipe> make_sft_recipe() { return std::make_unique<SftRecipe>(); }

}  // namespace mgbench::train
