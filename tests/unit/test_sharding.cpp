// FSDP's shard layout against torch.chunk (what FSDP2's _chunk_with_empty calls); the parallel plan
// and parallelize's transforms of a model.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include "axes/parallel_plan.h"
#include "core/error.h"
#include "models/mobilenet_v2.h"
#include "runtime/mpi_communicator.h"
#include "train/parallel/fsdp.h"
#include "train/parallel/parallelize.h"
#include "train/recipe.h"

namespace mgbench {
namespace {

TEST(ShardLayout, RowsAreTorchChunkOnDimZero) {
  for (const std::vector<std::int64_t>& sizes :
       {std::vector<std::int64_t>{10, 3}, {7}, {1, 4}, {2, 2, 2}, {64, 16}, {5, 1}, {3}}) {
    for (int world : {1, 2, 3, 4, 8}) {
      const torch::Tensor full = torch::arange(c10::multiply_integers(sizes)).reshape(sizes);
      const std::vector<torch::Tensor> chunks = torch::chunk(full, world, 0);
      const train::ShardLayout l = train::ShardLayout::of(sizes, world);
      EXPECT_EQ(l.chunk_rows, chunks.front().size(0)) << full.sizes() << " over " << world;
      for (int r = 0; r < world; ++r) {
        // torch.chunk may return fewer chunks than asked; FSDP2 pads with empty ones.
        const std::int64_t expected = r < static_cast<int>(chunks.size()) ? chunks[r].size(0) : 0;
        EXPECT_EQ(l.valid_rows(r), expected) << full.sizes() << " over " << world << ", rank " << r;
        if (expected > 0) {
          EXPECT_TRUE(torch::equal(full.narrow(0, l.first_row(r), expected), chunks[r]));
        }
      }
      EXPECT_EQ(l.shard_sizes()[0], l.chunk_rows);
      EXPECT_GE(l.shard_numel() * world, full.numel());
    }
  }
  EXPECT_EQ(train::ShardLayout::of({}, 2).rows, 1);  // a 0-dim parameter is one row
  EXPECT_THROW(train::ShardLayout::of({4}, 0), std::invalid_argument);
}

// LoRA's units (a frozen embedding, layers of a frozen base and trainable adapters, a frozen norm
// and head): the embedding is gathered once (no gradient flows through it, so not again in
// backward), the layers twice, the root and the head once (kept); only the layers reduce-scatter,
// their adapters alone. Bytes at 3 ranks, padded to 3 x ceil(rows / 3) rows, fp32.
TEST(MicroBatchCollectives, LoraGathersTheFrozenBaseAndReduceScattersTheAdapters) {
  const train::UnitShape embedding{{{10, 4}}, {false}, true};
  const train::UnitShape layer{{{4, 4}, {2, 4}, {4, 2}}, {false, true, true}, true};  // base, lora_a, lora_b
  const train::UnitShape root{{{4}}, {false}, false};
  const train::UnitShape head{{{10, 4}}, {false}, false};
  const std::vector<train::UnitShape> units{embedding, layer, layer, root, head};
  const train::MicroBatchCollectives c = train::micro_batch_collectives(units, 3, 4, true);
  // [10, 4] over 3 ranks: 4 rows each, 12 x 4 x 4 B; a layer: 6x4 + 3x4 + 6x2 = 48 elements.
  const std::int64_t emb = 12 * 4 * 4, lay = (6 * 4 + 3 * 4 + 6 * 2) * 4, norm = 6 * 4, adapters = (3 * 4 + 6 * 2) * 4;
  EXPECT_EQ(c.all_gather_bytes, (std::vector<std::int64_t>{emb, lay, lay, norm, emb, lay, lay}));
  EXPECT_EQ(c.reduce_scatter_bytes, (std::vector<std::int64_t>{adapters, adapters}));
  // Kept after forward: nothing gathered again.
  EXPECT_EQ(train::micro_batch_collectives(units, 3, 4, false).all_gather_bytes.size(), units.size());
  // One rank: the units' own bytes.
  EXPECT_EQ(train::micro_batch_collectives(units, 1, 4, true).all_gather_bytes.front(), 10 * 4 * 4);
}

// Full fine-tuning's units: a tied embedding / head used twice in forward, two layers, the root.
// Beside the shards a rank holds the whole gradients of the two largest trained units, padded as
// reduce-scattered, the tied unit's twice (its second gradient is made before it is summed); an
// untied embedding is not gathered again for backward (its backward reads only the token ids).
TEST(ShardedMemory, CountsTheWholeGradientsBesideTheShards) {
  train::UnitShape tied{{{10, 4}}, {true}, false};
  tied.forward_uses = 2;
  const train::UnitShape layer{{{4, 4}, {2, 4}}, {true, true}, true};
  const train::UnitShape root{{{4}}, {true}, false};
  const std::int64_t emb = 12 * 4 * 4, lay = (6 * 4 + 3 * 4) * 4;  // padded to 3 ranks, fp32
  const train::ShardedMemory m = train::sharded_memory({tied, layer, layer, root}, 3, 4, true);
  EXPECT_EQ(m.trainable_shard_bytes, (emb + 2 * lay + 6 * 4) / 3);
  EXPECT_EQ(m.whole_gradient_peak_bytes, 2 * emb + lay);
  EXPECT_EQ(m.gathered_peak_bytes, 10 * 4 * 4 + 4 * 4 + 2 * (4 * 4 + 2 * 4) * 4);

  train::UnitShape untied{{{10, 4}}, {true}, true};
  untied.backward_reads_parameters = false;
  const train::UnitShape head{{{10, 4}}, {true}, false};
  const train::MicroBatchCollectives c = train::micro_batch_collectives({untied, layer, root, head}, 3, 4, true);
  EXPECT_EQ(c.all_gather_bytes, (std::vector<std::int64_t>{emb, lay, 6 * 4, emb, lay}));
  EXPECT_EQ(train::sharded_memory({untied, layer, root, head}, 3, 4, true).whole_gradient_peak_bytes, 2 * emb);

  // gradient_bytes_per_rank: fsdp the shards and the whole ones; replicated DDP's buckets besides,
  // unless the gradients are the buckets' views; one rank, the gradients alone.
  axes::ParallelPlan plan;
  plan.world = 3;
  plan.sharding = axes::Sharding::kFsdp;
  EXPECT_EQ(train::gradient_bytes_per_rank(plan, false, 100, 40), 140);
  plan.sharding = axes::Sharding::kNone;
  EXPECT_EQ(train::gradient_bytes_per_rank(plan, false, 100, 40), 200);
  EXPECT_EQ(train::gradient_bytes_per_rank(plan, true, 100, 40), 100);
  plan.world = 1;
  EXPECT_EQ(train::gradient_bytes_per_rank(plan, false, 100, 40), 100);
}

TEST(ParallelPlan, ShardsOnlyOverSeveralRanks) {
  const axes::ParallelPlan fsdp{1, axes::Sharding::kFsdp, true, false};
  EXPECT_FALSE(fsdp.fully_sharded());  // one rank: --sharding none's run
  EXPECT_FALSE(fsdp.replicated());
  EXPECT_EQ(fsdp.shard_world(), 1);
  const axes::ParallelPlan four = fsdp.at(4);
  EXPECT_TRUE(four.fully_sharded());
  EXPECT_FALSE(four.replicated());
  EXPECT_EQ(four.shard_world(), 4);
  EXPECT_EQ(four.sharding, axes::Sharding::kFsdp);
  const axes::ParallelPlan ddp{4, axes::Sharding::kNone, true, false};
  EXPECT_TRUE(ddp.replicated());
  EXPECT_FALSE(ddp.fully_sharded());
  EXPECT_EQ(ddp.shard_world(), 1);
  EXPECT_FALSE(ddp.at(1).replicated());
  // The option's rows are the enum's, in order.
  ASSERT_EQ(axes::sharding_choices().size(), 2u);
  EXPECT_EQ(axes::sharding_choices()[0].name, "none");
  EXPECT_EQ(axes::sharding_choices()[1].value, axes::Sharding::kFsdp);
}

TEST(Parallelize, AppliesThePlansTransformsOrRefusesAModelWithoutUnits) {
  runtime::MpiCommunicator comm(MPI_COMM_SELF);
  torch::manual_seed(0);
  models::MobileNetV2 net(models::MobileNetV2Options{10, 0.25, 0.0});
  const axes::ParallelPlan none{1, axes::Sharding::kNone, true, false};
  // Replicas: nothing applied, nothing recorded.
  train::ParallelizedModel replica = train::parallelize(net.get(), none, comm);
  EXPECT_EQ(replica.fsdp, nullptr);
  EXPECT_TRUE(replica.fsdp_collectives.all_gather_bytes.empty());
  // FSDP on one rank: nothing sharded, but a micro-batch's collectives recorded as one unsharded
  // rank would issue them (what `mgbench predict` prices an FSDP step from).
  axes::ParallelPlan fsdp = none;
  fsdp.sharding = axes::Sharding::kFsdp;
  const train::ParallelizedModel one_rank = train::parallelize(net.get(), fsdp, comm);
  EXPECT_EQ(one_rank.fsdp, nullptr);
  const train::MicroBatchCollectives expected =
      train::micro_batch_collectives(train::unit_shapes(net->parameter_units()), 1, 4, true);
  EXPECT_EQ(one_rank.fsdp_collectives.all_gather_bytes, expected.all_gather_bytes);
  EXPECT_EQ(one_rank.fsdp_collectives.reduce_scatter_bytes, expected.reduce_scatter_bytes);
  EXPECT_FALSE(expected.all_gather_bytes.empty());
  // A recipe whose model has no units cannot be sharded; a model without activation checkpointing
  // refuses it (only a recipe whose model has it declares the option).
  EXPECT_THROW(train::parallelize(nullptr, fsdp, comm), ConfigError);
  axes::ParallelPlan checkpointing = none;
  checkpointing.activation_checkpointing = true;
  EXPECT_THROW(train::parallelize(nullptr, checkpointing, comm), ConfigError);
  EXPECT_THROW(train::parallelize(net.get(), checkpointing, comm), std::logic_error);
}

}  // namespace
}  // namespace mgbench
