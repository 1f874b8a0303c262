// --cuda-graphs (train/step_graphs.h; issue 47, item 4): the decision, the shape keys and the
// schedule of eager, captured and replayed micro-batches, on the CPU. The capture and replay
// themselves are tests/gpu/test_gpu.cpp's CudaGraphs test (SKIPPED without a GPU).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "axes/parallel_plan.h"
#include "axes/precision.h"
#include "core/error.h"
#include "results/schema.h"
#include "test_support.h"
#include "train/job_config.h"
#include "train/recipe.h"
#include "train/step_graphs.h"

namespace mgbench {
namespace {

using train::CudaGraphs;
using train::GraphAction;
using train::GraphFacts;
using train::resolve_cuda_graphs;

/// The ConfigError message of resolve_cuda_graphs(mode, facts), or "" when it throws none.
std::string refusal(CudaGraphs mode, const GraphFacts& facts) {
  try {
    resolve_cuda_graphs(mode, facts);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(CudaGraphDecision, OnIsHonouredOrRefusedNamingWhatPreventsIt) {
  const GraphFacts ok{true, 1, false, false, ""};
  EXPECT_TRUE(resolve_cuda_graphs(CudaGraphs::kOn, ok).use);
  EXPECT_EQ(resolve_cuda_graphs(CudaGraphs::kOn, ok).text(), "on");
  // DDP over several ranks: each rank replays its own micro-batches, the all-reduce after them.
  EXPECT_TRUE(resolve_cuda_graphs(CudaGraphs::kOn, {true, 4, false, false, ""}).use);
  // Each blocker alone, in the order a run meets them.
  const std::string cpu = refusal(CudaGraphs::kOn, {false, 1, false, false, ""});
  EXPECT_NE(cpu.find("--cuda-graphs on: the rank computes on the CPU"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("--cuda-graphs auto or off"), std::string::npos) << cpu;
  const std::string fsdp = refusal(CudaGraphs::kOn, {true, 2, true, false, ""});
  EXPECT_NE(fsdp.find("--cuda-graphs on: --sharding fsdp over 2 ranks: the units' all-gathers"), std::string::npos)
      << fsdp;
  EXPECT_NE(fsdp.find("--sharding none"), std::string::npos) << fsdp;
  const std::string dp = refusal(CudaGraphs::kOn, {true, 1, false, true, ""});
  EXPECT_NE(dp.find("--strategy dp"), std::string::npos) << dp;
  const std::string recipe = refusal(CudaGraphs::kOn, {true, 1, false, false, "the recipe's reason"});
  EXPECT_NE(recipe.find("--cuda-graphs on: the recipe's reason;"), std::string::npos) << recipe;
  // A DDP run's recipe blocker still applies.
  EXPECT_NE(refusal(CudaGraphs::kOn, {true, 2, false, false, "the recipe's reason"}).find("the recipe's reason"),
            std::string::npos);
}

TEST(CudaGraphDecision, AutoAndOffNeverCaptureAndSayWhy) {
  for (const GraphFacts& facts : std::vector<GraphFacts>{{true, 1, false, false, ""}, {false, 4, true, true, "x"}}) {
    const train::GraphDecision off = resolve_cuda_graphs(CudaGraphs::kOff, facts);
    EXPECT_FALSE(off.use);
    EXPECT_EQ(off.text(), "off: --cuda-graphs off");
  }
  const train::GraphDecision capturable = resolve_cuda_graphs(CudaGraphs::kAuto, {true, 1, false, false, ""});
  EXPECT_FALSE(capturable.use);
  EXPECT_NE(capturable.why_not.find("not yet compared with the eager step on a GPU"), std::string::npos);
  const train::GraphDecision blocked =
      resolve_cuda_graphs(CudaGraphs::kAuto, {true, 1, false, false, "the recipe's reason"});
  EXPECT_FALSE(blocked.use);
  EXPECT_EQ(blocked.text(), "off: the recipe's reason");
}

// The image recipe allows graphs; the LLM recipes do (their target lists then laid out at a fixed
// length, packed runs bounded by the row) and name each setting that still blocks them: packed
// sequences in fp32, whose attention runs per sequence on the host's lengths.
TEST(CudaGraphDecision, TheRecipesAllowGraphsOrNameTheSettingThatPreventsThem) {
  const auto image = train::configure("image");
  EXPECT_EQ(image->recipe->graph_blocker(image->train), "");
  const auto blocker = [](const char* recipe, const std::vector<std::pair<std::string, std::string>>& settings) {
    auto c = train::configure("llm", recipe);
    for (const auto& [name, value] : settings) c->set(name, value);
    return c->recipe->graph_blocker(c->train);
  };
  for (const char* recipe : {"lora", "qlora", "dpo", "full"}) {
    SCOPED_TRACE(recipe);
    EXPECT_EQ(blocker(recipe, {}), "");
    EXPECT_EQ(blocker(recipe, {{"pad-to-multiple", "64"}}), "");
    const std::string packed = blocker(recipe, {{"padding", "none"}, {"precision", "fp32"}});
    EXPECT_NE(packed.find("--padding none with --precision fp32"), std::string::npos) << packed;
    EXPECT_EQ(blocker(recipe, {{"padding", "none"}, {"precision", "bf16"}}), "");
    EXPECT_EQ(blocker(recipe, {{"padding", "pad"}, {"precision", "fp32"}}), "");
  }
  // LoRA dropout only blocks where the checkpointed layers would replay the generator's state.
  const std::string dropout = blocker("lora", {{"lora-dropout", "0.1"}, {"activation-checkpointing", "true"}});
  EXPECT_NE(dropout.find("--lora-dropout 0.1 under --activation-checkpointing"), std::string::npos) << dropout;
  EXPECT_EQ(blocker("lora", {{"lora-dropout", "0.1"}, {"activation-checkpointing", "false"}}), "");
  EXPECT_EQ(blocker("qat", {}), "");
  EXPECT_EQ(blocker("qat", {{"fake-quant-after-steps", "5"}}), "");  // captured again at the switch
}

data::Batch batch_of(std::vector<torch::Tensor> tensors) {
  data::Batch b;
  b.tensors = std::move(tensors);
  return b;
}

TEST(CudaGraphShapes, KeysFollowShapesDtypesAndLayoutsNotValues) {
  const torch::Tensor images = torch::zeros({4, 3, 8, 8});
  const torch::Tensor labels = torch::zeros({4}, torch::kInt64);
  const std::string key = train::shape_key(batch_of({images, labels}));
  EXPECT_EQ(key, train::shape_key(batch_of({torch::rand({4, 3, 8, 8}), torch::ones({4}, torch::kInt64)})));
  EXPECT_EQ(key, "cpu Float [4, 3, 8, 8]/[192, 64, 8, 1]; cpu Long [4]/[1]");
  EXPECT_NE(key, train::shape_key(batch_of({torch::zeros({2, 3, 8, 8}), torch::zeros({2}, torch::kInt64)})));
  EXPECT_NE(key, train::shape_key(batch_of({images.to(torch::kFloat64), labels})));
  EXPECT_NE(key, train::shape_key(batch_of({images.contiguous(torch::MemoryFormat::ChannelsLast), labels})));
  EXPECT_NE(key, train::shape_key(batch_of({images})));
}

TEST(CudaGraphShapes, EachShapeWarmsUpThenIsCapturedOnceThenReplaysWithinTheBound) {
  train::GraphSchedule s(2, 2);
  const std::vector<GraphAction> a = {s.next("a"), s.next("a"), s.next("a"), s.next("a"), s.next("a")};
  EXPECT_EQ(a, (std::vector<GraphAction>{GraphAction::kEager, GraphAction::kEager, GraphAction::kCapture,
                                         GraphAction::kReplay, GraphAction::kReplay}));
  EXPECT_EQ(s.next("b"), GraphAction::kEager);
  EXPECT_EQ(s.next("c"), GraphAction::kEager);  // seen before the bound is reached: may still be captured
  EXPECT_EQ(s.next("b"), GraphAction::kEager);
  EXPECT_EQ(s.next("b"), GraphAction::kCapture);                                 // the second graph: the bound
  for (int k = 0; k < 4; ++k) EXPECT_EQ(s.next("d"), GraphAction::kEager) << k;  // new shapes stay eager
  EXPECT_EQ(s.next("c"), GraphAction::kEager);  // its warm-up's end, but no graph is left
  EXPECT_EQ(s.next("c"), GraphAction::kEager);
  EXPECT_EQ(s.next("a"), GraphAction::kReplay);
  EXPECT_EQ(s.graphs(), 2);
  EXPECT_EQ(s.replays(), 5);  // a: its capture and three replays; b: its capture
  EXPECT_EQ(s.eager(), 2 + 2 + 4 + 3);
  EXPECT_EQ(s.beyond_bound(), 4 + 1);  // d's four and c's third (warmed up, no graph left); no warm-up
  EXPECT_THROW(train::GraphSchedule(0, 1), std::invalid_argument);
  EXPECT_THROW(train::GraphSchedule(1, 0), std::invalid_argument);
}

// Each step's record says what its micro-batches did (results::StepRecord::cuda_graph), from what the
// schedule counted over the step, as the epoch loop reads it: two micro-batches a step of one shape
// -- a warm-up step, then the step that captures (its second micro-batch already replays: counted
// as replayed, but the step paid the capture and dispatched the eager ops), then replays -- and a
// second shape arriving beside the first (mixed: one replays, one warms up).
TEST(CudaGraphShapes, EachStepIsRecordedAsEagerCapturedReplayedOrMixed) {
  train::GraphSchedule s(2, 16);
  const auto step = [&s](const std::vector<std::string>& keys) {
    const std::int64_t graphs = s.graphs(), replays = s.replays();
    for (const std::string& key : keys) s.next(key);
    return train::graph_use(static_cast<std::int64_t>(keys.size()), s.graphs() - graphs, s.replays() - replays);
  };
  EXPECT_EQ(step({"a", "a"}), results::kGraphEager);
  EXPECT_EQ(step({"a", "a"}), results::kGraphCaptured);
  EXPECT_EQ(step({"a", "a"}), results::kGraphReplayed);
  EXPECT_EQ(step({"a", "b"}), results::kGraphMixed);
  EXPECT_EQ(step({"b", "b"}), results::kGraphCaptured);
  EXPECT_EQ(step({"b", "a"}), results::kGraphReplayed);
  EXPECT_EQ(train::graph_use(3, 0, 0), results::kGraphEager);
  EXPECT_EQ(train::graph_use(1, 1, 1), results::kGraphCaptured);  // a one-micro-batch step that captured
}

// After forward changed (QAT's late switch), every shape warms up and is captured again, a new
// shape too (the bound counts the graphs held now); the totals go on.
TEST(CudaGraphShapes, ForgottenShapesWarmUpAndAreCapturedAgain) {
  train::GraphSchedule s(1, 1);
  EXPECT_EQ(s.next("a"), GraphAction::kEager);
  EXPECT_EQ(s.next("a"), GraphAction::kCapture);
  EXPECT_EQ(s.next("a"), GraphAction::kReplay);
  EXPECT_EQ(s.next("b"), GraphAction::kEager);  // the bound: one graph
  EXPECT_EQ(s.next("b"), GraphAction::kEager);
  s.forget();
  EXPECT_EQ(s.next("a"), GraphAction::kEager);  // the old graph computes the old forward: not replayed
  EXPECT_EQ(s.next("a"), GraphAction::kCapture);
  EXPECT_EQ(s.next("a"), GraphAction::kReplay);
  s.forget();
  EXPECT_EQ(s.next("b"), GraphAction::kEager);
  EXPECT_EQ(s.next("b"), GraphAction::kCapture);  // the bound counts the graphs held now
  EXPECT_EQ(s.graphs(), 3);
  EXPECT_EQ(s.replays(), 5);
  EXPECT_EQ(s.eager(), 5);
  EXPECT_EQ(s.beyond_bound(), 2);  // b's two before the first forget
}

// QAT's late switch (--fake-quant-after-steps 3) tells the loop that forward changed at step 3 and
// only then (its graphs are captured again), on a resume past the switch too; QAT from the start
// never does.
TEST(CudaGraphDecision, QatSaysWhenItsSwitchChangesForward) {
  const std::string model = test::oracle_dir() + "/llama_tiny_2256";
  MGBENCH_REQUIRE_INPUTS(model);
  const auto changes = [&](const char* after, const std::vector<std::int64_t>& steps) {
    auto c = train::configure("llm", "qat");
    for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
             {"model", model},
             {"tokenizer", test::shared_data_dir() + "/llama3/tiktoken_small.model"},
             {"dataset", "alpaca"},
             {"data", test::shared_data_dir() + "/text/alpaca/alpaca_cleaned_first5k.json"},
             {"limit", "4"},
             {"precision", "fp32"},
             {"device", "cpu"},
             {"qat-group-size", "32"},
             {"fake-quant-after-steps", after}}) {
      c->set(name, value);
    }
    c->validate();
    const axes::ParallelPlan plan;
    c->recipe->setup(
        {c->train, torch::kCPU, {}, axes::precision_info(axes::Precision::kFp32), 0, plan, nullptr, {}, false});
    std::vector<bool> changed;
    for (const std::int64_t step : steps) changed.push_back(c->recipe->begin_step(step));
    return changed;
  };
  EXPECT_EQ(changes("3", {0, 1, 2, 3, 4, 5}), (std::vector<bool>{false, false, false, true, false, false}));
  EXPECT_EQ(changes("3", {4, 5}), (std::vector<bool>{true, false}));  // a resume at step 4
  EXPECT_EQ(changes("0", {0, 1, 2}), (std::vector<bool>{false, false, false}));
}

}  // namespace
}  // namespace mgbench
