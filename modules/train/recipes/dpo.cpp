// The DPO recipe: preference fine-tuning of Llama 3 with LoRA, with TorchTune 0.6.1's
// lora_dpo_distributed semantics (recipes/lora_dpo_distributed.py, rlhf/loss/dpo.py,
// data/_collate.py padded_collate_dpo); the second paper (arXiv 2505.22905) profiles it next to
// LoRA, QLoRA and QAT.
//  - samples: a row's chosen and rejected conversations, each tokenised and truncated on its own
//    (data/text/preference.h); a micro-batch of B pairs is one batch of 2B sequences, chosen rows
//    first, right-padded together to the longest;
//  - policy: the model with its LoRA adapters (train/recipes/llama_finetune.h); reference: the same model with
//    every adapter disabled, under no_grad (one set of base weights, not two);
//  - a sequence's log-probability: the sum over its target tokens of log_softmax(logits) in fp32
//    (TorchTune's get_batch_log_probs), with only target positions reaching the output projection;
//  - loss: DPOLoss (train/recipes/dpo_loss.h), the mean over the micro-batch's pairs; the loop averages it
//    over the step's micro-batches and the ranks (as TorchTune's loss / grad_accum with DDP);
//  - metrics per step: TorchTune's rewards/chosen, rewards/rejected, rewards/accuracies (strict
//    chosen > rejected), rewards/margins, log_probs/chosen, log_probs/rejected, and the means of the
//    logits over every position and the vocabulary (logits/chosen, logits/rejected), computed
//    without the logits: the mean of h W^T over the vocabulary is h times W's mean row (positions:
//    the padded rows' every one; packed, the real tokens and the padding to --pad-to-multiple,
//    counted in the rejected: split_position_means).
#include "core/error.h"
#include "data/text/preference.h"
#include "models/llama.h"
#include "train/recipe.h"
#include "train/recipes/dpo_loss.h"
#include "train/recipes/llama_recipe.h"

namespace mgbench::train {
namespace {

struct DpoOptions {
  text::PreferenceKind dataset = text::PreferenceKind::kStackExchangePaired;
  double beta = 0.1;
  double label_smoothing = 0.0;
};

class DpoRecipe final : public LlamaRecipe {
 public:
  void declare(options::OptionTable& t) override {
    auto& o = options_;
    declare_model_and_data(t, o.dataset, text::preference_choices(), "the preference data's format",
                           "preference rows (chosen and rejected sequences)");
    t.section("DPO");
    // Bounded: beta scales log-probability ratios of tens of nats; at 1,000 the loss is already a
    // step function, and 1e308 overflowed float in the first step (a divergence naming no option).
    t.add("dpo-beta", o.beta, "DPO's beta: the strength of the reference's regularisation (TorchTune's 0.1)")
        .above(0)
        .at_most(1000)
        .same_workload();
    t.add("label-smoothing", o.label_smoothing, "conservative DPO's label smoothing (0: plain DPO)")
        .at_least(0)
        .below(0.5)
        .same_workload();
  }

  void validate(const TrainOptions& train) const override { llama_.validate(train, "dpo", /*needs_adapters=*/true); }

  void setup(const RecipeContext& ctx) override {
    setup_rows(ctx, pairs_, [&](const text::Llama3Tokenizer& tokenizer) {
      return text::load_preference_dataset(data_.data, tokenizer,
                                           {options_.dataset, data_.max_seq_len, data_.train_on_input});
    });
  }

  std::int64_t train_size() const override { return static_cast<std::int64_t>(pairs_.size()); }

  /// The B pairs as 2B sequences, chosen rows first (TorchTune's padded_collate_dpo), with their
  /// target positions; samples = B.
  data::Batch assemble(const data::PlannedBatch& plan, bool pin_memory) const override {
    std::vector<const text::TokenizedSample*> rows;
    for (const auto i : plan.indices) rows.push_back(&pairs_[static_cast<std::size_t>(i)].chosen);
    for (const auto i : plan.indices) rows.push_back(&pairs_[static_cast<std::size_t>(i)].rejected);
    data::Batch batch = collate(rows, pin_memory);
    batch.samples = static_cast<std::int64_t>(plan.indices.size());
    return batch;
  }

  LossNormalization loss_normalization() const override { return LossNormalization::kMeanPerMicroBatch; }

  MicroBatchLoss forward(const data::Batch& batch) override {
    const std::int64_t pairs = batch.samples;
    const LlamaFinetune::TargetLogProbs policy = llama_.target_log_probs(batch);
    const torch::Tensor pi = sequence_log_probs(batch, policy.log_probs);
    torch::Tensor ref;
    {
      torch::NoGradGuard no_grad;
      const models::AdaptersDisabled reference(llama_.model());
      ref = sequence_log_probs(batch, llama_.target_log_probs(batch).log_probs);
    }
    const torch::Tensor pi_chosen = pi.narrow(0, 0, pairs), pi_rejected = pi.narrow(0, pairs, pairs);
    const DpoLoss d = dpo_loss({pi_chosen, pi_rejected}, {ref.narrow(0, 0, pairs), ref.narrow(0, pairs, pairs)},
                               options_.beta, options_.label_smoothing);
    torch::Tensor logits_chosen, logits_rejected;
    {
      torch::NoGradGuard no_grad;
      // The logits' mean over positions and vocabulary, as TorchTune logs it: mean(h W^T) = mean(h) . mean_v(W).
      // The output projection is frozen (DPO trains adapters): its mean row is computed once, in
      // fp32 accumulation without an fp32 copy of the weight (2 GB at 8B, every micro-batch before).
      if (!head_mean_row_.defined()) {
        head_mean_row_ = llama_.model().output_weight().mean({0}, /*keepdim=*/false, torch::kFloat32);
      }
      // Every position's mean logit, [R, T] or [1, S], then its means over the chosen and the rejected.
      const torch::Tensor means =
          split_position_means(batch, torch::matmul(policy.hidden.detach().to(torch::kFloat32), head_mean_row_), pairs);
      logits_chosen = means[0];
      logits_rejected = means[1];
    }
    const torch::Tensor metrics =
        torch::stack({d.chosen_rewards.mean(), d.rejected_rewards.mean(),
                      d.chosen_rewards.gt(d.rejected_rewards).to(torch::kFloat32).mean(),
                      (d.chosen_rewards - d.rejected_rewards).mean(), pi_chosen.detach().mean(),
                      pi_rejected.detach().mean(), logits_chosen, logits_rejected})
            .to(torch::kFloat64);
    return {d.losses.mean(), metrics};
  }

  std::vector<std::string> metric_names() const override {
    return {"rewards_chosen",   "rewards_rejected",   "reward_accuracy", "reward_margin",
            "log_probs_chosen", "log_probs_rejected", "logits_chosen",   "logits_rejected"};
  }

  /// The policy's forward and backward, and the reference's forward (half as much again).
  double flops(const data::Batch& batch) const override { return 1.5 * llama_.flops(batch); }

  h5::Attributes attributes() const override {
    h5::Attributes a = llama_.attributes();
    a.emplace_back("train_samples", static_cast<std::int64_t>(pairs_.size()));
    return a;
  }

  std::vector<TensorExport> tensor_exports() const override { return llama_.exports(); }
  void finish(int rank) override {
    if (rank == 0) llama_.save();
  }

 private:
  std::int64_t sequences_per_row() const override { return 2; }  // chosen and rejected
  DpoOptions options_;
  std::vector<text::PreferenceSample> pairs_;
  torch::Tensor head_mean_row_;  // fp32 [dim]: the frozen output projection's mean over the vocabulary
};

}  // namespace

std::unique_ptr<Recipe> make_dpo_recipe() { return std::make_unique<DpoRecipe>(); }

}  // namespace mgbench::train
