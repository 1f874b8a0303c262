#include <algorithm>
#include <set>
#include <stdexcept>

#include "runtime/buckets.h"
#include "test_support.h"

namespace mgbench::runtime {
namespace {

TEST(Buckets, MatchPyTorchDdp) {
  const auto cases = test::load_oracle_json("buckets_cases.json");
  MGBENCH_SKIP_WITHOUT_ORACLE(cases, "buckets_cases.json");
  for (const auto& c : cases) {
    std::vector<TensorSize> sizes;
    for (std::size_t i = 0; i < c["bytes"].size(); ++i) sizes.push_back({c["bytes"][i], c["dtypes"][i]});
    const auto got = assign_buckets(sizes, c["first"], c["cap"]);
    std::vector<std::vector<std::size_t>> mine;
    for (const auto& b : got) mine.push_back(b.tensors);
    auto expected = c["buckets"].get<std::vector<std::vector<std::size_t>>>();
    if (!c["ordered"].get<bool>()) {  // PyTorch's order of partially filled buckets across dtypes is unspecified
      std::sort(mine.begin(), mine.end());
      std::sort(expected.begin(), expected.end());
    }
    EXPECT_EQ(mine, expected) << c["name"];
  }
}

TEST(Buckets, EveryTensorOnceAndLimitsRespected) {
  std::vector<TensorSize> sizes;
  for (int i = 0; i < 50; ++i) sizes.push_back({static_cast<std::size_t>(100 + 37 * i), 0});
  const auto buckets = assign_buckets(sizes, 500, 2000);
  std::set<std::size_t> seen;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    std::size_t bytes = 0;
    for (auto t : buckets[b].tensors) {
      EXPECT_TRUE(seen.insert(t).second);
      bytes += sizes[t].bytes;
    }
    EXPECT_EQ(bytes, buckets[b].bytes);
    // A bucket closes at the first tensor that reaches the limit.
    const std::size_t limit = b == 0 ? 500 : 2000;
    if (b + 1 < buckets.size()) {
      EXPECT_LT(bytes - sizes[buckets[b].tensors.back()].bytes, limit);
    }
  }
  EXPECT_EQ(seen.size(), sizes.size());
  EXPECT_EQ(buckets.front().tensors.front(), 49u);  // the last parameter's gradient arrives first
  EXPECT_THROW(assign_buckets(sizes, 0, 10), std::invalid_argument);
}

}  // namespace
}  // namespace mgbench::runtime
