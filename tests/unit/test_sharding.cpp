// FSDP's shard layout against torch.chunk (what FSDP2's _chunk_with_empty calls).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "train/sharding.h"

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

}  // namespace
}  // namespace mgbench
