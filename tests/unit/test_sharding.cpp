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

}  // namespace
}  // namespace mgbench
