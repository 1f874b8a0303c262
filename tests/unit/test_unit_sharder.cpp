// FSDP's shards cut while the model is built (train/parallel/unit_sharder.h, train::build_llama): on
// every rank of 2 and 3, each shard equals the rows FSDP cuts from the model built whole -- drawn
// with the same seed, or read from the same checkpoint (one file, a sharded index, a tied head, NF4
// projections) -- the model keeps no whole tensor, a non-finite value in a rank's rows is named by
// its index in the whole tensor, and the host holds the shards and one unit, not the model.
#include <filesystem>
#include <limits>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/error.h"
#include "host_bytes.h"
#include "models/llama.h"
#include "models/safetensors.h"
#include "test_support.h"
#include "train/parallel/unit_sharder.h"
#include "train/recipes/llama_finetune.h"

namespace mgbench {
namespace {

using models::BaseWeights;
using models::LlamaConfig;
using models::LlamaForCausalLM;

/// FSDP2's shard of `full` at rank of world, the oracle: torch.chunk's chunk on dim 0, padded with
/// zero rows to the first chunk's rows (_chunk_with_empty), empty chunks all padding.
torch::Tensor chunk_padded(const torch::Tensor& full, int rank, int world) {
  const std::vector<torch::Tensor> chunks = torch::chunk(full, world, 0);
  std::vector<std::int64_t> sizes = full.sizes().vec();
  sizes[0] = chunks.front().size(0);
  torch::Tensor padded = torch::zeros(sizes, full.options());
  if (static_cast<std::size_t>(rank) < chunks.size()) {
    padded.narrow(0, 0, chunks[static_cast<std::size_t>(rank)].size(0)).copy_(chunks[static_cast<std::size_t>(rank)]);
  }
  return padded;
}

/// Builds as a run does at `rank` of `world` (seeded), checks every shard against the rows of
/// `whole` (the same model built unsharded) and that the sharded model holds no whole tensor.
void expect_shards_of(LlamaForCausalLM whole, const LlamaConfig& c, BaseWeights base, const std::string& checkpoint,
                      int rank, int world) {
  const std::string where = fmt::format("{} rank {} of {}", checkpoint.empty() ? "random" : checkpoint, rank, world);
  train::UnitSharder sharder(rank, world);
  torch::manual_seed(7);
  LlamaForCausalLM sharded = train::build_llama(c, base, torch::kCPU, checkpoint, &sharder);
  const std::vector<models::ParameterUnit> expected = whole->parameter_units();
  const std::vector<models::ParameterUnit> actual = sharded->parameter_units();
  ASSERT_EQ(expected.size(), actual.size());
  std::size_t tensors = 0;
  for (std::size_t u = 0; u < expected.size(); ++u) {
    ASSERT_EQ(expected[u].names, actual[u].names) << where;
    for (std::size_t k = 0; k < expected[u].parameters.size(); ++k) {
      const torch::Tensor& full = actual[u].parameters[k];
      EXPECT_EQ(full.storage().nbytes(), 0u) << where << ": " << actual[u].names[k] << " kept whole";
      const torch::Tensor shard = sharder.take(full);
      ASSERT_TRUE(shard.defined()) << where << ": " << actual[u].names[k] << " was not cut";
      EXPECT_TRUE(torch::equal(shard, chunk_padded(expected[u].parameters[k], rank, world)))
          << where << ": " << actual[u].names[k];
      ++tensors;
    }
    ASSERT_EQ(expected[u].packed.size(), actual[u].packed.size());
    for (std::size_t w = 0; w < expected[u].packed.size(); ++w) {
      for (std::size_t k = 0; k < expected[u].packed[w].parts.size(); ++k) {
        const torch::Tensor shard = sharder.take(actual[u].packed[w].parts[k]);
        ASSERT_TRUE(shard.defined()) << where << ": " << actual[u].packed[w].name << " part " << k;
        const torch::Tensor bytes = expected[u].packed[w].parts[k].reshape({-1}).view(torch::kUInt8);
        EXPECT_TRUE(torch::equal(shard, torch::chunk(bytes, world)[static_cast<std::size_t>(rank)]))
            << where << ": " << actual[u].packed[w].name << " part " << k;
        ++tensors;
      }
    }
  }
  EXPECT_GT(tensors, 0u);
  EXPECT_EQ(sharder.pending(), 0u) << where;
}

void expect_sharded_builds_equal_whole(const LlamaConfig& c, BaseWeights base, const std::string& checkpoint,
                                       const std::vector<int>& worlds) {
  torch::manual_seed(7);
  const LlamaForCausalLM whole = train::build_llama(c, base, torch::kCPU, checkpoint, nullptr);
  for (const int world : worlds) {
    for (int rank = 0; rank < world; ++rank) expect_shards_of(whole, c, base, checkpoint, rank, world);
  }
}

TEST(UnitSharder, RandomInitialisationCutAtBuildEqualsTheWholeModelsRows) {
  LlamaConfig c = LlamaConfig::preset("tiny");
  c.tie_word_embeddings = false;
  expect_sharded_builds_equal_whole(c, BaseWeights::kDense, "", {2, 3});
  c.tie_word_embeddings = true;
  expect_sharded_builds_equal_whole(c, BaseWeights::kDense, "", {3});
}

TEST(UnitSharder, CheckpointRowsReadAtBuildEqualTheWholeModelsRows) {
  for (const char* name : {"llama_tiny", "llama_tiny_sharded", "llama_tiny_tied"}) {
    const std::string dir = test::oracle_dir() + "/" + name;
    MGBENCH_REQUIRE_INPUTS(dir);
    expect_sharded_builds_equal_whole(LlamaConfig::from_hf_json(dir + "/config.json"), BaseWeights::kDense, dir,
                                      {2, 3});
  }
  // 12 ranks: the k / v projections' 32 rows are chunks of 3, the last rank's empty, yet its build
  // reads (nothing of) them and the checkpoint is used up on every rank alike.
  const std::string dir = test::oracle_dir() + "/llama_tiny";
  expect_sharded_builds_equal_whole(LlamaConfig::from_hf_json(dir + "/config.json"), BaseWeights::kDense, dir, {12});
}

TEST(UnitSharder, Nf4ProjectionsQuantisedWholeThenCutInWholeBlocks) {
  const std::string dir = test::oracle_dir() + "/llama_tiny_nf4";
  MGBENCH_REQUIRE_INPUTS(dir);
  const LlamaConfig c = LlamaConfig::from_hf_json(dir + "/config.json");
  expect_sharded_builds_equal_whole(c, BaseWeights::kNf4, dir, {2});
  expect_sharded_builds_equal_whole(c, BaseWeights::kNf4, "", {2});
  // Blocks that 3 ranks cannot split are refused at the first unit that has them, named.
  train::UnitSharder three(0, 3);
  test::expect_error<ConfigError>([&] { train::build_llama(c, BaseWeights::kNf4, torch::kCPU, dir, &three); },
                                  {"model.layers.0.self_attn", "quantisation blocks", "3 ranks"});
}

TEST(UnitSharder, ANonFiniteValueInARanksRowsIsNamedByItsIndexInTheWholeTensor) {
  const std::string dir = test::oracle_dir() + "/llama_tiny";
  MGBENCH_REQUIRE_INPUTS(dir);
  const LlamaConfig c = LlamaConfig::from_hf_json(dir + "/config.json");
  test::TempDir bad;
  std::filesystem::copy_file(dir + "/config.json", bad.file("config.json"));
  const models::SafetensorsCheckpoint checkpoint(dir);
  const std::string name = "model.layers.1.self_attn.v_proj.weight";  // [32, 64]: rank 1 of 2 reads rows 16..31
  const std::int64_t flat = 20 * c.hidden_size + 5;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& n : checkpoint.names()) {
    torch::Tensor t = checkpoint.tensor(n);
    if (n == name) t.view({-1})[flat] = std::numeric_limits<float>::quiet_NaN();
    tensors.emplace_back(n, t);
  }
  models::write_safetensors(bad.file("model.safetensors"), tensors);
  train::UnitSharder rank0(0, 2), rank1(1, 2);
  EXPECT_NO_THROW(train::build_llama(c, BaseWeights::kDense, torch::kCPU, bad.path(), &rank0));
  test::expect_error<DataError>([&] { train::build_llama(c, BaseWeights::kDense, torch::kCPU, bad.path(), &rank1); },
                                {name, "1 non-finite", fmt::format("flat index {}", flat)});
}

TEST(UnitSharder, ARankHoldsItsShardsAndOneUnitWhileLoading) {
  // Issue 48: loading under FSDP is bounded by the rank's shards and one unit, not the model. A
  // Llama of 8 layers (untied, fp32) written to a checkpoint, loaded at rank 1 of 4.
  const LlamaConfig c = test::eight_layer_llama();
  test::TempDir dir;
  std::int64_t whole = 0, largest_unit = 0;
  {
    LlamaForCausalLM model(c);
    models::write_safetensors(dir.file("model.safetensors"), model->hf_state_dict());
    for (const models::ParameterUnit& u : model->parameter_units()) {
      std::int64_t bytes = 0;
      for (const auto& p : u.parameters) bytes += static_cast<std::int64_t>(p.nbytes());
      whole += bytes;
      largest_unit = std::max(largest_unit, bytes);
    }
  }
  auto probe = std::make_shared<test::HostTensorBytes>();
  train::UnitSharder sharder(1, 4);
  {
    const c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, probe);
    LlamaForCausalLM sharded = train::build_llama(c, BaseWeights::kDense, torch::kCPU, dir.path(), &sharder);
  }
  const std::int64_t shards = whole / 4;
  ASSERT_GT(whole, 4 * largest_unit);
  EXPECT_LE(probe->peak, shards + largest_unit + (std::int64_t{1} << 16)) << "of a model of " << whole << " B";
  EXPECT_GE(probe->current, shards) << "the shards are held";  // the cut shards, still in the sharder
}

}  // namespace
}  // namespace mgbench
