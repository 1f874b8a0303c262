#include <algorithm>
#include <set>

#include "core/error.h"
#include "core/option_table.h"
#include "data/sampler.h"
#include "test_support.h"

namespace mgbench::data {
namespace {

using axes::Strategy;
using axes::strategy_choices;
using axes::strategy_info;

TEST(DistributedSampler, MatchesPyTorch) {
  const auto cases = test::load_oracle_json("sampler_cases.json");
  MGBENCH_SKIP_WITHOUT_ORACLE(cases, "sampler_cases.json");
  ASSERT_GT(cases.size(), 100u);
  for (const auto& c : cases) {
    const auto got =
        distributed_sampler_indices(c["n"], c["world"], c["rank"], c["seed"], c["epoch"], c["shuffle"], c["drop_last"]);
    ASSERT_EQ(got, c["indices"].get<std::vector<std::int64_t>>())
        << "n=" << c["n"] << " world=" << c["world"] << " rank=" << c["rank"] << " seed=" << c["seed"]
        << " epoch=" << c["epoch"] << " shuffle=" << c["shuffle"] << " drop_last=" << c["drop_last"];
  }
}

EpochPlanOptions options(Strategy s, std::int64_t n, std::int64_t batch, int world, int rank) {
  return {s, n, batch, world, rank, /*seed=*/7, /*shuffle=*/true, /*drop_last=*/false, /*shard_sizes=*/{}};
}

// Tar shards (webdataset): each rank reads whole shards -- the shards dealt as DistributedSampler
// deals indices, the rank's samples shuffled within -- and every rank the same count, that of
// DistributedSampler over the samples, so the epoch shape does not change.
TEST(ShardSampler, RanksReadWholeDisjointShardsAndRunTheSameSteps) {
  const std::vector<std::int64_t> sizes = {10, 10, 10, 10, 10, 7, 10, 10};  // 77 samples, shard 5 short
  std::vector<std::int64_t> first = {0};
  for (auto n : sizes) first.push_back(first.back() + n);
  auto shard_of = [&](std::int64_t i) { return std::upper_bound(first.begin(), first.end(), i) - first.begin() - 1; };
  for (std::int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<std::set<std::int64_t>> shards(3);
    for (int rank = 0; rank < 3; ++rank) {
      const auto mine = shard_sampler_indices(sizes, 3, rank, 7, epoch, true, false);
      EXPECT_EQ(mine.size(), 26u);  // ceil(77 / 3), DistributedSampler's num_samples
      // The rank's shards, as DistributedSampler(8 shards) gives this rank (padding wraps around).
      const auto dealt = distributed_sampler_indices(8, 3, rank, 7, epoch, true, false);
      const std::set<std::int64_t> expected(dealt.begin(), dealt.end());
      for (auto i : mine) {
        EXPECT_TRUE(expected.count(shard_of(i))) << "rank " << rank << " sample " << i;
        shards[static_cast<std::size_t>(rank)].insert(shard_of(i));
      }
      // Every shard dealt is read (26 of >= 27 samples cannot miss a shard of 7 or 10), its samples
      // each once: the rank's samples are 26 distinct ones of its shards, none repeated.
      EXPECT_EQ(shards[static_cast<std::size_t>(rank)], expected) << "rank " << rank;
      EXPECT_EQ(std::set<std::int64_t>(mine.begin(), mine.end()).size(), mine.size()) << "rank " << rank;
      // Shuffled within: not the shards' order.
      EXPECT_FALSE(std::is_sorted(mine.begin(), mine.end()));
      // The same epoch gives the same order; the plan of ddp-ds is this one.
      EXPECT_EQ(mine, shard_sampler_indices(sizes, 3, rank, 7, epoch, true, false));
      EpochPlanOptions o = options(Strategy::kDdpDs, 77, 8, 3, rank);
      o.shard_sizes = sizes;
      std::vector<std::int64_t> planned;
      for (const auto& b : plan_epoch(o, epoch)) planned.insert(planned.end(), b.indices.begin(), b.indices.end());
      EXPECT_EQ(planned, mine);
    }
    // 8 shards over 3 ranks: 9 slots, one shard dealt twice; otherwise disjoint.
    std::size_t dealt = 0;
    for (const auto& s : shards) dealt += s.size();
    EXPECT_LE(dealt, 9u);
  }
  // Unshuffled: rank 0 reads shards 0, 3, 6 in order.
  const auto plain = shard_sampler_indices(sizes, 3, 0, 7, 0, false, false);
  EXPECT_EQ(plain.front(), 0);
  EXPECT_EQ(plain[10], 30);
  EXPECT_EQ(plain[20], first[6]);
  EXPECT_THROW(shard_sampler_indices({0, 0}, 2, 0, 7, 0, true, false), ConfigError);
}

TEST(EpochPlan, DdpComputesEverythingOnEveryRank) {
  for (int rank = 0; rank < 3; ++rank) {
    const auto plan = plan_epoch(options(Strategy::kDdp, 100, 8, 3, rank), 0);
    ASSERT_EQ(plan.size(), 13u);  // ceil(100 / 8)
    std::multiset<std::int64_t> seen;
    for (const auto& b : plan) {
      EXPECT_TRUE(b.compute);
      seen.insert(b.indices.begin(), b.indices.end());
    }
    EXPECT_EQ(seen.size(), 100u);
    EXPECT_EQ(std::set<std::int64_t>(seen.begin(), seen.end()).size(), 100u);
  }
  // Same order on every rank.
  EXPECT_EQ(plan_epoch(options(Strategy::kDdp, 100, 8, 3, 0), 1)[0].indices,
            plan_epoch(options(Strategy::kDdp, 100, 8, 3, 2), 1)[0].indices);
}

TEST(EpochPlan, DdpRrLoadsAllAndComputesRoundRobin) {
  // 100 samples, batch 8: 13 batches; 3 ranks: 5 rounds, 15 loads, 2 wrapped-around batches.
  std::multiset<std::int64_t> computed_batches;
  for (int rank = 0; rank < 3; ++rank) {
    const auto plan = plan_epoch(options(Strategy::kDdpRr, 100, 8, 3, rank), 2);
    ASSERT_EQ(plan.size(), 15u);
    std::int64_t computed = 0;
    for (const auto& b : plan) {
      EXPECT_EQ(b.compute, b.batch_index % 3 == rank);
      if (b.compute) {
        ++computed;
        computed_batches.insert(b.batch_index % 13);
      }
    }
    EXPECT_EQ(computed, 5);
  }
  // Every batch computed at least once, batches 0 and 1 twice (the padding).
  for (std::int64_t b = 0; b < 13; ++b) EXPECT_EQ(computed_batches.count(b), b < 2 ? 2u : 1u) << "batch " << b;
}

TEST(EpochPlan, DdpDsBatchesTheSamplerSequence) {
  std::set<std::int64_t> all;
  for (int rank = 0; rank < 4; ++rank) {
    const auto o = options(Strategy::kDdpDs, 50, 4, 4, rank);
    const auto plan = plan_epoch(o, 3);
    std::vector<std::int64_t> flat;
    for (const auto& b : plan) flat.insert(flat.end(), b.indices.begin(), b.indices.end());
    EXPECT_EQ(flat, distributed_sampler_indices(50, 4, rank, 7, 3, true, false));
    EXPECT_EQ(plan.size(), 4u);  // 13 samples per rank in batches of 4
    all.insert(flat.begin(), flat.end());
  }
  EXPECT_EQ(all.size(), 50u);
}

// The strategy rows' counts (axes/strategy.h: the loop's steps per epoch and the predictor's) are
// what the plans compute, for every strategy, shape and rank.
TEST(EpochPlan, StrategyRowsCountTheBatchesThePlansCompute) {
  int cases = 0;
  for (const auto& row : axes::strategy_choices()) {
    for (const std::int64_t n : {1, 7, 50, 97, 100, 128}) {
      for (const std::int64_t batch : {1, 3, 8, 32}) {
        for (const int world : {1, 2, 3, 4, 7}) {
          if (row.single_process && world > 1) continue;
          for (const bool drop_last : {false, true}) {
            const axes::EpochShape shape{n, batch, world, drop_last};
            for (int rank = 0; rank < world; ++rank) {
              EpochPlanOptions o = options(row.value, n, batch, world, rank);
              o.drop_last = drop_last;
              std::int64_t computed = 0, loaded = 0;
              try {
                for (const auto& b : plan_epoch(o, 1)) {
                  computed += b.compute ? 1 : 0;
                  ++loaded;
                }
              } catch (const ConfigError&) {  // no whole batch to plan: the row says none
              }
              ASSERT_EQ(row.computed_batches(shape), computed)
                  << row.name << " n=" << n << " batch=" << batch << " world=" << world << " rank=" << rank
                  << " drop_last=" << drop_last;
              EXPECT_EQ(loaded, row.loads_every_batch ? computed * world : computed) << row.name;
              ++cases;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 1000);
  // Steps: whole steps of grad_accum micro-batches, capped by max_steps.
  const auto& rr = axes::strategy_info(Strategy::kDdpRr);
  EXPECT_EQ(axes::steps_per_epoch(rr, {100, 8, 3, false}, 2, 0), 2);  // 5 micro-batches: 2 steps of 2
  EXPECT_EQ(axes::steps_per_epoch(rr, {100, 8, 3, false}, 1, 4), 4);
}

TEST(EpochPlan, RejectsBadOptions) {
  EXPECT_THROW(mgbench::options::parse_choice(strategy_choices(), "strategy", "fsdp"), ConfigError);
  EXPECT_THROW(plan_epoch(options(Strategy::kDdp, 10, 0, 1, 0), 0), ConfigError);
  EXPECT_THROW(plan_epoch(options(Strategy::kDdp, 0, 4, 1, 0), 0), ConfigError);
  EXPECT_EQ(mgbench::options::parse_choice(strategy_choices(), "strategy", "ddp-rr"), Strategy::kDdpRr);
  EXPECT_EQ(mgbench::options::name_of(strategy_choices(), Strategy::kDdpDs), "ddp-ds");
  EXPECT_TRUE(strategy_info(Strategy::kDp).single_process);
  // dp plans as DistributedSampler over its one rank: every sample once per epoch.
  EXPECT_EQ(plan_epoch(options(Strategy::kDp, 10, 4, 1, 0), 0).size(), 3u);
}

}  // namespace
}  // namespace mgbench::data
