// DPO's pieces against independent oracles (tests/python/make_oracles.py): TorchTune 0.6.1's
// DPOLoss, and sequence log-probabilities of a LoRA policy and its adapter-free reference against
// transformers + peft (disable_adapter()).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "models/llama.h"
#include "models/log_probs.h"
#include "models/state_dict.h"
#include "test_support.h"
#include "train/recipes/dpo_loss.h"
#include "train/recipes/llama_batches.h"

namespace mgbench {
namespace {

torch::Tensor vec(const nlohmann::json& j) { return torch::tensor(j.get<std::vector<double>>(), torch::kFloat64); }

TEST(DpoLoss, EqualsTorchTunesDPOLoss) {
  const auto cases = test::load_oracle_json("dpo_loss_cases.json");
  MGBENCH_SKIP_WITHOUT_ORACLE(cases, "dpo_loss_cases.json");
  ASSERT_EQ(cases.size(), 4u);
  for (const auto& c : cases) {
    const auto& in = c["inputs"];
    const train::DpoLoss d = train::dpo_loss({vec(in[0]), vec(in[1])}, {vec(in[2]), vec(in[3])},
                                             c["beta"].get<double>(), c["label_smoothing"].get<double>());
    EXPECT_LT((d.losses - vec(c["losses"])).abs().max().item<double>(), 1e-12) << c["beta"] << c["label_smoothing"];
    EXPECT_LT((d.chosen_rewards - vec(c["chosen_rewards"])).abs().max().item<double>(), 1e-12);
    EXPECT_LT((d.rejected_rewards - vec(c["rejected_rewards"])).abs().max().item<double>(), 1e-12);
  }
}

TEST(DpoLoss, TorchTunesLiteralCaseAndTheStartingPoint) {
  // TorchTune's test: policy and reference margins 0, 10, 20 apart at beta 0.1: -logsigmoid(0, 1, 2).
  const auto t = [](std::vector<double> v) { return torch::tensor(v, torch::kFloat64); };
  const train::DpoLoss d = train::dpo_loss({t({-0.5, -10.0, -1.0}), t({-0.1, -30.0, -21.0})},
                                           {t({-0.5, -10.1, -0.1}), t({-0.1, -20.1, -0.1})}, 0.1, 0.0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(d.losses[i].item<double>(), std::log1p(std::exp(-static_cast<double>(i))), 1e-12) << i;
  }
  // Policy = reference (LoRA's B = 0 at the start): loss ln 2, rewards 0, whatever the log-probs.
  const torch::Tensor same = t({-3.0, -40.0});
  const train::DpoLoss start = train::dpo_loss({same, same * 2}, {same, same * 2}, 0.1, 0.0);
  EXPECT_NEAR(start.losses.mean().item<double>(), std::log(2.0), 1e-15);
  EXPECT_EQ(start.chosen_rewards.abs().max().item<double>(), 0.0);
  EXPECT_FALSE(start.chosen_rewards.gt(start.rejected_rewards).any().item<bool>());  // accuracy 0: strict
  EXPECT_THROW(train::dpo_loss({same, t({1.0})}, {same, same}, 0.1, 0.0), std::invalid_argument);
}

TEST(DpoLogProbs, PolicyAndReferenceEqualTransformersAndPeft) {
  const std::string root = test::oracle_dir();
  MGBENCH_REQUIRE_INPUTS(root + "/dpo_log_probs.pt");
  const auto oracle = models::read_torch_state_dict(root + "/dpo_log_probs.pt");
  models::LlamaForCausalLM model(models::LlamaConfig::from_hf_json(root + "/llama_tiny_2256/config.json"));
  model->load_hf_checkpoint(root + "/llama_tiny_2256");
  models::LoraOptions lora;
  lora.rank = 4;
  lora.alpha = 8;
  model->apply_lora(lora);
  model->load_lora_adapter(root + "/llama_tiny_2256_lora/adapter_model.safetensors");
  model->eval();
  // The rows as the dpo recipe's collate builds them (labels aligned with tokens, not shifted).
  const torch::Tensor ids = oracle.at("ids"), labels = oracle.at("labels"), lengths = oracle.at("lengths");
  std::vector<text::TokenizedSample> rows(4);
  std::vector<const text::TokenizedSample*> pointers;
  for (std::int64_t r = 0; r < 4; ++r) {
    const std::int64_t n = lengths[r].item<std::int64_t>();
    for (std::int64_t k = 0; k < n; ++k) {
      rows[r].tokens.push_back(static_cast<std::int32_t>(ids[r][k].item<std::int64_t>()));
      rows[r].labels.push_back(static_cast<std::int32_t>(labels[r][k].item<std::int64_t>()));
    }
    pointers.push_back(&rows[static_cast<std::size_t>(r)]);
  }
  torch::NoGradGuard no_grad;
  const auto close = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
  };
  // Right-padded as the oracle, and packed without padding (--padding none); each also padded up to a
  // multiple of 16 tokens with its target list at the grid's length (--pad-to-multiple, the layout of
  // --cuda-graphs): the same log-probs.
  const std::int64_t real = lengths.sum().item<std::int64_t>();
  for (const auto& [padding, static_layout] :
       {std::pair{train::Padding::kPad, false}, std::pair{train::Padding::kPad, true},
        std::pair{train::Padding::kNone, false}, std::pair{train::Padding::kNone, true}}) {
    SCOPED_TRACE(testing::Message() << (padding == train::Padding::kPad ? "pad" : "none") << " static "
                                    << static_layout);
    const std::int64_t multiple = static_layout ? 16 : 1;
    const data::Batch batch = train::collate_sequences(pointers, {2004, padding, multiple, static_layout}, false);
    const std::int64_t length = batch.tensors[0].size(1);
    if (padding == train::Padding::kPad) {
      EXPECT_TRUE(torch::equal(batch.tensors[0].narrow(1, 0, ids.size(1)), ids));
      EXPECT_EQ(length, static_layout ? (ids.size(1) + 15) / 16 * 16 : ids.size(1));
      EXPECT_TRUE(batch.tensors[0].narrow(1, ids.size(1), length - ids.size(1)).eq(2004).all().item<bool>());
    } else {
      EXPECT_EQ(length, static_layout ? (real + 15) / 16 * 16 : real);
      // The runs: each sequence's length, the padding in the last; attention's bound the longest run,
      // or the row (static: every batch of this shape launches the same kernels).
      const auto packing = train::packing_of(batch);
      ASSERT_TRUE(packing.has_value());
      std::vector<std::int64_t> runs;
      for (std::int64_t r = 0; r < 4; ++r) runs.push_back(lengths[r].item<std::int64_t>());
      runs.back() += length - real;
      EXPECT_EQ(packing->runs.lengths, runs);
      EXPECT_EQ(packing->runs.max_length, static_layout ? length : *std::max_element(runs.begin(), runs.end()));
      std::vector<std::int32_t> ends{0};
      for (const std::int64_t n : runs) ends.push_back(ends.back() + static_cast<std::int32_t>(n));
      ASSERT_EQ(packing->runs.cu_seqlens.scalar_type(), torch::kInt32);
      EXPECT_EQ(std::vector<std::int32_t>(packing->runs.cu_seqlens.data_ptr<std::int32_t>(),
                                          packing->runs.cu_seqlens.data_ptr<std::int32_t>() + 5),
                ends);
      EXPECT_EQ(train::sequences_of(batch), 4);
    }
    EXPECT_EQ(batch.tokens, real);
    EXPECT_EQ(batch.padded_tokens, batch.tensors[0].numel());
    std::int64_t targets = 0;  // positions whose next label is not masked
    for (const auto& row : rows)
      targets +=
          std::count_if(row.labels.begin() + 1, row.labels.end(), [](auto l) { return l != text::kIgnoreIndex; });
    EXPECT_EQ(batch.loss_targets, targets);
    EXPECT_EQ(batch.tensors[1].size(0), static_layout ? batch.tensors[0].numel() : targets);
    if (static_layout) {
      EXPECT_EQ(batch.tensors[3].eq(4).sum().item<std::int64_t>(), batch.tensors[0].numel() - targets);
    }
    const auto log_probs = [&] {
      const auto packing = train::packing_of(batch);
      const torch::Tensor h = model->hidden_states(batch.tensors[0], packing ? &*packing : nullptr);
      const torch::Tensor selected = h.reshape({-1, h.size(-1)}).index_select(0, batch.tensors[1]);
      return train::sequence_log_probs(batch,
                                       models::target_log_probs(selected, model->output_weight(), batch.tensors[2]));
    };
    const torch::Tensor policy = log_probs();
    torch::Tensor reference;
    {
      const models::AdaptersDisabled off(*model);
      reference = log_probs();
    }
    const torch::Tensor again = log_probs();  // adapters back on
    // Sums of ~20 log-probs of about -7.7 each, fp32 through two layers.
    EXPECT_LT(close(policy, oracle.at("policy")), 1e-4) << policy << oracle.at("policy");
    EXPECT_LT(close(reference, oracle.at("reference")), 1e-4) << reference << oracle.at("reference");
    EXPECT_GT(close(policy, reference), 1e-3);  // the adapter matters: the comparison is not vacuous
    EXPECT_EQ(close(again, policy), 0.0);
  }
}

// The layout --cuda-graphs trains on (Collation: padded up to a multiple, the target list at the grid's
// length with stand-ins in an extra sequence) against the real targets alone, in fp64 on a random tiny
// Llama with LoRA, padded and packed: the SFT loss (the targets' log-probs summed over the sequences)
// and every adapter gradient equal; a micro-batch without one target gives a zero loss and zero,
// defined, gradients.
TEST(LlamaBatches, AStaticLayoutTrainsAsTheRealTargets) {
  torch::manual_seed(9);
  models::LlamaConfig c = models::LlamaConfig::preset("tiny");
  c.vocab_size = 300;
  models::LlamaForCausalLM model(c);
  model->to(torch::kFloat64);
  model->apply_lora(models::LoraOptions{});
  {
    torch::NoGradGuard no_grad;
    for (auto& [_, t] : model->lora_state_dict()) t.normal_(0, 0.1);
  }
  std::vector<text::TokenizedSample> rows(3);
  const std::int64_t lengths[3] = {7, 13, 4}, prompts[3] = {3, 5, 4};  // the last: no target at all
  for (std::size_t r = 0; r < rows.size(); ++r) {
    for (std::int64_t k = 0; k < lengths[r]; ++k) {
      rows[r].tokens.push_back(static_cast<std::int32_t>(torch::randint(0, 300, {1}).item<std::int64_t>()));
      rows[r].labels.push_back(k < prompts[r] ? text::kIgnoreIndex : rows[r].tokens.back());
    }
  }
  const auto loss_and_gradients = [&](const std::vector<const text::TokenizedSample*>& sequences,
                                      const train::Collation& how) {
    const data::Batch batch = train::collate_sequences(sequences, how, false);
    model->zero_grad();
    const auto packing = train::packing_of(batch);
    const torch::Tensor h = model->hidden_states(batch.tensors[0], packing ? &*packing : nullptr);
    const torch::Tensor selected = h.reshape({-1, h.size(-1)}).index_select(0, batch.tensors[1]);
    const torch::Tensor loss =
        -train::sequence_log_probs(batch, models::target_log_probs(selected, model->output_weight(), batch.tensors[2]))
             .sum();
    loss.backward();
    std::vector<torch::Tensor> grads{loss.detach()};
    for (auto& [_, t] : model->lora_state_dict()) grads.push_back(t.grad().defined() ? t.grad().clone() : t.grad());
    return grads;
  };
  for (const train::Padding padding : {train::Padding::kPad, train::Padding::kNone}) {
    SCOPED_TRACE(padding == train::Padding::kPad ? "pad" : "none");
    const std::vector<const text::TokenizedSample*> all{&rows[0], &rows[1], &rows[2]};
    const auto real = loss_and_gradients(all, {0, padding, 1, false});
    const auto graphed = loss_and_gradients(all, {0, padding, 8, true});
    EXPECT_GT(std::abs(real[0].item<double>()), 1.0);
    for (std::size_t i = 0; i < real.size(); ++i) {
      ASSERT_TRUE(graphed[i].defined()) << i;
      EXPECT_LT((real[i] - graphed[i]).abs().max().item<double>(), 1e-12) << i;
    }
    // No target: nothing to learn, and every adapter still gets its (zero) gradient.
    const auto none = loss_and_gradients({&rows[2]}, {0, padding, 8, true});
    for (std::size_t i = 0; i < none.size(); ++i) {
      ASSERT_TRUE(none[i].defined()) << i;
      EXPECT_EQ(none[i].abs().max().item<double>(), 0.0) << i;
    }
  }
}

// DPO's logits means (logits/chosen, logits/rejected) split a batch's positions between its first
// sequences and the rest: padded, whole rows (their padding in each); packed, at the first rejected
// sequence's start, read from the runs on the device, the padding to the multiple in the rest.
TEST(LlamaBatches, PositionMeansSplitAtTheFirstRejectedSequence) {
  std::vector<text::TokenizedSample> rows(4);
  const std::int64_t lengths[4] = {3, 5, 4, 2};  // chosen 3 and 5, rejected 4 and 2
  for (std::size_t r = 0; r < rows.size(); ++r) {
    rows[r].tokens.assign(static_cast<std::size_t>(lengths[r]), 7);
    rows[r].labels.assign(static_cast<std::size_t>(lengths[r]), 7);
  }
  const std::vector<const text::TokenizedSample*> all{&rows[0], &rows[1], &rows[2], &rows[3]};
  for (const bool static_shapes : {false, true}) {
    SCOPED_TRACE(static_shapes);
    // Packed: positions 0..7 are the chosen, 8..13 the rejected, then the padding to 16.
    const data::Batch packed = train::collate_sequences(all, {0, train::Padding::kNone, 8, static_shapes}, false);
    ASSERT_EQ(packed.tensors[0].sizes(), (std::vector<std::int64_t>{1, 16}));
    const torch::Tensor at = torch::arange(16, torch::kFloat64).reshape({1, 16});
    const torch::Tensor means = train::split_position_means(packed, at, 2);
    EXPECT_EQ(means[0].item<double>(), 3.5);   // (0 + ... + 7) / 8
    EXPECT_EQ(means[1].item<double>(), 11.5);  // (8 + ... + 15) / 8
    // Padded: rows of 8 positions; the chosen rows 0 and 1 hold 0..15, the rejected 16..31.
    const data::Batch padded = train::collate_sequences(all, {0, train::Padding::kPad, 8, static_shapes}, false);
    ASSERT_EQ(padded.tensors[0].sizes(), (std::vector<std::int64_t>{4, 8}));
    const torch::Tensor rows_means =
        train::split_position_means(padded, torch::arange(32, torch::kFloat64).reshape({4, 8}), 2);
    EXPECT_EQ(rows_means[0].item<double>(), 7.5);
    EXPECT_EQ(rows_means[1].item<double>(), 23.5);
    test::expect_error<std::invalid_argument>([&] { train::split_position_means(packed, at, 4); },
                                              {"the first 4 of 4 sequences"});
    test::expect_error<std::invalid_argument>([&] { train::split_position_means(packed, torch::zeros({16}), 2); },
                                              {"values [16] for tokens [1, 16]"});
  }
}

// --cuda-graphs with rows padded only to their longest: one shape per length, said before the run.
TEST(LlamaBatches, GraphsWithoutAPaddingMultipleAreWarnedOf) {
  train::LlamaDataOptions o;
  o.max_seq_len = 512;
  EXPECT_EQ(o.graph_shapes_warning(false, 16), "");  // eager: any shape is fine
  const std::string warning = o.graph_shapes_warning(true, 16);
  for (const char* needle : {"--pad-to-multiple 1", "1 to 512 tokens", "past 16 shapes", "--pad-to-multiple 64"}) {
    EXPECT_NE(warning.find(needle), std::string::npos) << needle << " in " << warning;
  }
  o.max_seq_len = 0;
  EXPECT_NE(o.graph_shapes_warning(true, 16).find("unbounded: --max-seq-len 0"), std::string::npos);
  o.pad_to_multiple = 64;
  EXPECT_EQ(o.graph_shapes_warning(true, 16), "");
}

}  // namespace
}  // namespace mgbench
