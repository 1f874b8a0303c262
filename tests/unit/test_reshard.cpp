// A checkpoint written by N ranks read by M (train/checkpoint/reshard.h): every rank's shards are
// those FSDP2 cuts at M ranks (torch.chunk on dim 0, padded: the oracle is torch::chunk, not
// ShardLayout), whole tensors and metadata are rank (r mod N)'s, damaged sets are refused naming
// the file; and the optimizer's named state (AdamW, SGD) round-trips.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "test_support.h"
#include "train/checkpoint/checkpoint_state.h"
#include "train/checkpoint/reshard.h"

namespace mgbench {
namespace {

/// FSDP2's shard of rank r of `world` (torch.chunk, padded with zero rows to the first chunk's rows).
torch::Tensor chunk_of(const torch::Tensor& whole, int world, int r) {
  const std::vector<torch::Tensor> chunks = torch::chunk(whole, world, 0);
  std::vector<std::int64_t> sizes = whole.sizes().vec();
  sizes[0] = chunks.front().size(0);
  torch::Tensor shard = torch::zeros(sizes, whole.options());
  if (r < static_cast<int>(chunks.size())) shard.narrow(0, 0, chunks[r].size(0)).copy_(chunks[r]);
  return shard;
}

/// Whole tensors of awkward shapes: rows not a multiple of the world sizes, fewer rows than ranks, bf16.
std::vector<std::pair<std::string, torch::Tensor>> wholes() {
  torch::manual_seed(3);
  return {{"model/w", torch::randn({7, 3})},
          {"model/tiny", torch::randn({2, 5})},
          {"model/vector", torch::randn({10})},
          {"optimizer/w/exp_avg", torch::randn({7, 3}).to(torch::kBFloat16)}};
}

/// Writes the rank files of `world` ranks: the shards of wholes(), a per-rank whole tensor and metadata.
std::vector<std::string> write_ranks(const test::TempDir& dir, int world) {
  std::vector<std::string> files;
  for (int r = 0; r < world; ++r) {
    train::CheckpointState state;
    for (const auto& [name, whole] : wholes()) state.put_shard(name, chunk_of(whole, world, r), whole.sizes(), world);
    state.put("rng/cpu", torch::full({4}, r, torch::kUInt8));
    state.put("epoch", std::int64_t{5});
    state.put_text("rank-text", fmt::format("rank {}", r));
    files.push_back(dir.file(fmt::format("{}-rank-{}.safetensors", world, r)));
    state.write(files.back(), r);
  }
  return files;
}

TEST(Reshard, TheShardsOfNRanksBecomeTheShardsFsdpCutsAtM) {
  test::TempDir dir;
  for (const auto& [from, to] : std::vector<std::pair<int, int>>{{2, 3}, {3, 2}, {1, 4}, {4, 1}, {3, 5}, {2, 2}}) {
    const std::vector<std::string> files = write_ranks(dir, from);
    for (int r = 0; r < to; ++r) {
      const train::CheckpointState state = train::reshard_checkpoint(files, r, to);
      for (const auto& [name, whole] : wholes()) {
        const torch::Tensor shard = state.tensor(name);
        EXPECT_EQ(shard.scalar_type(), whole.scalar_type()) << name;
        EXPECT_TRUE(torch::equal(shard, chunk_of(whole, to, r)))
            << name << ": " << from << " -> " << to << " rank " << r;
        EXPECT_EQ(state.whole_shape(name), whole.sizes().vec()) << name;
      }
      // Whole tensors and metadata: rank r mod N's.
      EXPECT_TRUE(torch::equal(state.tensor("rng/cpu"), torch::full({4}, r % from, torch::kUInt8)));
      EXPECT_EQ(state.text("rank-text"), fmt::format("rank {}", r % from));
      EXPECT_EQ(state.integer("epoch"), 5);
      // Written again, it is a checkpoint of `to` ranks that reads back the same.
      const std::string again = dir.file(fmt::format("again-{}-{}-{}.safetensors", from, to, r));
      state.write(again, r);
      const train::CheckpointState back(again);
      EXPECT_TRUE(torch::equal(back.tensor("model/w"), chunk_of(wholes()[0].second, to, r)));
    }
  }
}

TEST(Reshard, DamagedOrMisplacedRankFilesAreRefusedNamingTheFile) {
  test::TempDir dir;
  std::vector<std::string> files = write_ranks(dir, 2);
  // Swapped: rank 1's file in rank 0's place.
  test::expect_error<DataError>([&] { train::reshard_checkpoint({files[1], files[0]}, 0, 3); }, {files[1]});
  // A rank whose chunk holds rows of a sharded tensor lacks it.
  train::CheckpointState partial;
  partial.put_shard("model/w", chunk_of(wholes()[0].second, 2, 1), wholes()[0].second.sizes(), 2);
  const std::string lacking = dir.file("lacking.safetensors");
  partial.write(lacking, 1);
  test::expect_error<DataError>([&] { train::reshard_checkpoint({files[0], lacking}, 1, 3); }, {lacking, "model/tiny"});
  // A shard of another layout than its whole shape says (written by another number of ranks).
  train::CheckpointState other;
  for (const auto& [name, whole] : wholes()) {
    const int world = name == "model/w" ? 3 : 2;
    other.put_shard(name, chunk_of(whole, world, 1), whole.sizes(), world);
  }
  const std::string misfit = dir.file("misfit.safetensors");
  other.write(misfit, 1);
  test::expect_error<DataError>(
      [&] {
        train::reshard_checkpoint({files[0], misfit}, 0, 1);
      },
      {"'model/w' is 3x3, and a shard of 7x3 over 2 rank(s) is 4x3"});
  // A whole shape that is not sizes separated by commas.
  train::CheckpointState bad;
  bad.put_shard("model/w", chunk_of(wholes()[0].second, 2, 0), wholes()[0].second.sizes(), 2);
  bad.put_text("shard:model/w", "7,");
  test::expect_error<DataError>([&] { bad.whole_shape("model/w"); }, {"'7,', not sizes separated by commas"});
  EXPECT_THROW(partial.put_shard("x", torch::zeros({3, 3}), {7, 3}, 2), std::invalid_argument);
}

template <typename Optimizer, typename Options>
void expect_optimizer_round_trip(const Options& options) {
  torch::manual_seed(11);
  torch::nn::Linear model(5, 3);
  model->to(torch::kFloat64);
  Optimizer optimizer(model->parameters(), options);
  auto step = [](torch::nn::Linear& m, torch::optim::Optimizer& o, int i) {
    torch::manual_seed(100 + i);
    o.zero_grad();
    m->forward(torch::randn({8, 5}, torch::kFloat64)).pow(2).mean().backward();
    o.step();
  };
  for (int i = 0; i < 3; ++i) step(model, optimizer, i);
  train::CheckpointState state;
  train::put_module(state, "model/", *model);
  train::put_optimizer(state, "optimizer/", optimizer, train::module_tensors(*model), 1);
  for (int i = 3; i < 5; ++i) step(model, optimizer, i);

  torch::manual_seed(12);
  torch::nn::Linear restored(5, 3);
  restored->to(torch::kFloat64);
  Optimizer restored_optimizer(restored->parameters(), options);
  train::load_module(state, "model/", *restored);
  train::load_optimizer(state, "optimizer/", restored_optimizer, train::module_tensors(*restored));
  for (int i = 3; i < 5; ++i) step(restored, restored_optimizer, i);
  EXPECT_TRUE(torch::equal(model->weight, restored->weight));
  EXPECT_TRUE(torch::equal(model->bias, restored->bias));
}

TEST(CheckpointOptimizer, AdamWAndSgdStatesRoundTripByName) {
  expect_optimizer_round_trip<torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  expect_optimizer_round_trip<torch::optim::AdamW>(torch::optim::AdamWOptions(1e-2).amsgrad(true));
  expect_optimizer_round_trip<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
  // A parameter without stored state gets none (a fresh AdamW would continue differently: its step 1).
  torch::manual_seed(11);
  torch::nn::Linear model(5, 3);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  train::CheckpointState empty;
  train::load_optimizer(empty, "optimizer/", optimizer, train::module_tensors(*model));
  EXPECT_TRUE(optimizer.state().empty());
}

}  // namespace
}  // namespace mgbench
