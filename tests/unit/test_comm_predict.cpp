// `mgbench comm`'s arithmetic (bus factors, message counts, expected values, sizes) and the scaling
// predictor's (steps per epoch, buckets, all-reduce cost, a whole prediction), on hand-computed cases.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "comm/collectives.h"
#include "comm/comm_benchmark.h"
#include "core/error.h"
#include "report/predict.h"
#include "test_support.h"

namespace mgbench {
namespace {

using comm::Collective;
using comm::collective_info;

TEST(Collectives, BusFactorsAreNcclTests) {
  // nccl-tests doc/PERFORMANCE.md: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n, broadcast 1.
  const auto& ar = collective_info(Collective::kAllReduce);
  EXPECT_DOUBLE_EQ(ar.bus_factor(1), 0.0);
  EXPECT_DOUBLE_EQ(ar.bus_factor(2), 1.0);
  EXPECT_DOUBLE_EQ(ar.bus_factor(4), 1.5);
  EXPECT_DOUBLE_EQ(ar.bus_factor(8), 1.75);
  for (const auto c : {Collective::kAllGather, Collective::kReduceScatter}) {
    EXPECT_DOUBLE_EQ(collective_info(c).bus_factor(2), 0.5);
    EXPECT_DOUBLE_EQ(collective_info(c).bus_factor(4), 0.75);
    EXPECT_DOUBLE_EQ(collective_info(c).bus_factor(8), 0.875);
  }
  EXPECT_DOUBLE_EQ(collective_info(Collective::kBroadcast).bus_factor(4), 1.0);
}

TEST(Collectives, MessageCountsRoundLikeNcclTests) {
  // 1000 bytes of fp32 over 3 ranks: 250 elements, 83 per rank, 249 (996 bytes) in the whole message.
  const auto ag = collective_info(Collective::kAllGather).counts(1000, 4, 3, 2);
  EXPECT_EQ(ag.input, 83);
  EXPECT_EQ(ag.output, 249);
  EXPECT_EQ(ag.bytes, 996);
  EXPECT_EQ(ag.in_place_input_offset, 166);
  const auto rs = collective_info(Collective::kReduceScatter).counts(1000, 4, 3, 2);
  EXPECT_EQ(rs.input, 249);
  EXPECT_EQ(rs.output, 83);
  EXPECT_EQ(rs.in_place_output_offset, 166);
  const auto ar = collective_info(Collective::kAllReduce).counts(1000, 4, 3, 2);
  EXPECT_EQ(ar.input, 250);
  EXPECT_EQ(ar.output, 250);
  EXPECT_EQ(ar.bytes, 1000);
  EXPECT_EQ(collective_info(Collective::kAllReduce).counts(1, 8, 3, 0).output, 1);  // at least one element
  EXPECT_EQ(collective_info(Collective::kAllGather).counts(8, 4, 4, 0).output, 4);  // one per rank
}

// What `comm --max-bytes` is checked against (comm_benchmark.cpp): an all-reduce of 1 MiB of fp32
// (262,144 elements in and out) at 2 ranks, by hand from the buffers the benchmark makes.
TEST(Collectives, CaseBytesCountTheBuffersOfATimedAndACheckedCase) {
  const comm::MessageCounts n = collective_info(Collective::kAllReduce).counts(1 << 20, 4, 2, 0);
  ASSERT_EQ(n.input, 262144);
  constexpr double kMiB = 1 << 20;
  const comm::CaseBytes gpu = comm::case_bytes(n, 4, /*check=*/true, /*cuda=*/true);
  EXPECT_DOUBLE_EQ(gpu.device, 2 * (1 + 1) * kMiB + 2 * kMiB);  // timed + check buffers, the float64 output
  EXPECT_DOUBLE_EQ(gpu.host, kMiB + 17 * 262144.0);             // the check's input; expected, copy, comparison
  const comm::CaseBytes timed = comm::case_bytes(n, 4, /*check=*/false, /*cuda=*/true);
  EXPECT_DOUBLE_EQ(timed.device, 3 * kMiB);  // input, output, the pattern copied in
  EXPECT_DOUBLE_EQ(timed.host, kMiB);        // the pattern built
  const comm::CaseBytes cpu = comm::case_bytes(n, 4, /*check=*/true, /*cuda=*/false);
  EXPECT_DOUBLE_EQ(cpu.device, 0);
  EXPECT_DOUBLE_EQ(cpu.host, 4 * kMiB + kMiB + 17 * 262144.0);  // one memory; no float64 copy on a device
}

TEST(Collectives, ExpectedOutputsByHand) {
  // Rank r holds 1 + (r + i) mod 3 at element i.
  EXPECT_TRUE(
      torch::equal(comm::input_pattern(4, 1, torch::kFloat32, torch::kCPU), torch::tensor({2.F, 3.F, 1.F, 2.F})));
  using runtime::ReduceOp;
  const auto ar = collective_info(Collective::kAllReduce);
  const auto counts3 = ar.counts(16, 4, 3, 0);  // 4 elements; 3 ranks hold {1, 2, 3} in some order at each
  EXPECT_TRUE(torch::equal(comm::expected_output(ar, counts3, ReduceOp::kSum, 0, 0, 3),
                           torch::full({4}, 6.0, torch::kFloat64)));
  EXPECT_TRUE(torch::equal(comm::expected_output(ar, counts3, ReduceOp::kMax, 0, 0, 3),
                           torch::full({4}, 3.0, torch::kFloat64)));
  EXPECT_TRUE(torch::equal(comm::expected_output(ar, counts3, ReduceOp::kMin, 0, 0, 3),
                           torch::full({4}, 1.0, torch::kFloat64)));
  // 2 ranks: rank 0 [1, 2], rank 1 [2, 3].
  const auto ag = collective_info(Collective::kAllGather);
  EXPECT_TRUE(torch::equal(comm::expected_output(ag, ag.counts(16, 4, 2, 0), ReduceOp::kSum, 0, 0, 2),
                           torch::tensor({1.0, 2.0, 2.0, 3.0}, torch::kFloat64)));
  // Rank 1 of 2 gets elements 2, 3 of the sum: (3 + 1), (1 + 2).
  const auto rs = collective_info(Collective::kReduceScatter);
  EXPECT_TRUE(torch::equal(comm::expected_output(rs, rs.counts(16, 4, 2, 1), ReduceOp::kSum, 0, 1, 2),
                           torch::tensor({4.0, 3.0}, torch::kFloat64)));
  const auto bc = collective_info(Collective::kBroadcast);
  EXPECT_TRUE(torch::equal(comm::expected_output(bc, bc.counts(12, 4, 3, 0), ReduceOp::kSum, 1, 0, 3),
                           torch::tensor({2.0, 3.0, 1.0}, torch::kFloat64)));
}

TEST(CommOptions, SizesParseAndSweepLikeNcclTests) {
  EXPECT_EQ(comm::parse_bytes("max-bytes", "64M"), 64LL << 20);
  EXPECT_EQ(comm::parse_bytes("max-bytes", "4K"), 4096);
  EXPECT_EQ(comm::parse_bytes("max-bytes", "1.5K"), 1536);
  EXPECT_EQ(comm::parse_bytes("min-bytes", "8"), 8);
  EXPECT_EQ(comm::parse_bytes("max-bytes", "1G"), 1LL << 30);
  EXPECT_THROW(comm::parse_bytes("max-bytes", "12Q"), ConfigError);
  EXPECT_THROW(comm::parse_bytes("max-bytes", "0"), ConfigError);
  EXPECT_THROW(comm::parse_bytes("max-bytes", "M"), ConfigError);
  EXPECT_EQ(comm::sweep_sizes(8, 64, 2), (std::vector<std::int64_t>{8, 16, 32, 64}));
  EXPECT_EQ(comm::sweep_sizes(8, 100, 4), (std::vector<std::int64_t>{8, 32}));
  const auto huge = comm::sweep_sizes(1, std::numeric_limits<std::int64_t>::max() / 2, 2);  // no overflow
  EXPECT_EQ(huge.size(), 62U);
  comm::CommOptions o;
  o.collectives = {"all"};
  o.validate();
  EXPECT_EQ(o.resolved_collectives.size(), 4U);
  o.collectives = {"all-to-all"};
  EXPECT_THROW(o.validate(), ConfigError);
  o.collectives = {"broadcast"};
  o.min_bytes = "1M";
  o.max_bytes = "1K";
  EXPECT_THROW(o.validate(), ConfigError);
}

TEST(Predict, StepsPerEpochFollowTheSamplers) {
  // The strategy rows the loop runs by (axes/strategy.h; equal to the plans: test_sampler.cpp).
  auto steps = [](const char* strategy, std::int64_t samples, std::int64_t batch, int ranks, std::int64_t accum,
                  std::int64_t max_steps, bool drop_last) {
    return axes::steps_per_epoch(axes::find_strategy("strategy", strategy), {samples, batch, ranks, drop_last}, accum,
                                 max_steps);
  };
  // 1000 samples, 32 per step.
  EXPECT_EQ(steps("ddp-ds", 1000, 32, 1, 1, 0, false), 32);
  EXPECT_EQ(steps("ddp-ds", 1000, 32, 2, 1, 0, false), 16);  // ceil(500 / 32)
  EXPECT_EQ(steps("ddp-ds", 1000, 32, 3, 1, 0, false), 11);  // ceil(334 / 32): the padded shard
  EXPECT_EQ(steps("ddp-ds", 1000, 32, 3, 1, 0, true), 10);   // floor(333 / 32)
  EXPECT_EQ(steps("ddp-rr", 1000, 32, 3, 1, 0, false), 11);  // ceil(32 batches / 3)
  EXPECT_EQ(steps("ddp", 1000, 32, 4, 1, 0, false), 32);     // every rank every batch
  EXPECT_EQ(steps("ddp-ds", 1000, 32, 2, 1, 5, false), 5);   // max_steps
  // Accumulation: whole steps of micro-batches, as the loop runs them (ceil(500 / 16) = 32 micro-
  // batches of 16 make 10 steps of 3; a steps-of-48-samples count would say ceil(500 / 48) = 11).
  EXPECT_EQ(steps("ddp-ds", 1000, 16, 2, 3, 0, false), 10);
}

TEST(Predict, GradientBucketsAsGradSyncFillsThem) {
  constexpr double kMiB = 1024.0 * 1024.0;
  EXPECT_EQ(report::gradient_buckets(60 * kMiB, kMiB, 25 * kMiB),
            (std::vector<double>{kMiB, 25 * kMiB, 25 * kMiB, 9 * kMiB}));
  EXPECT_EQ(report::gradient_buckets(0.5 * kMiB, kMiB, 25 * kMiB), (std::vector<double>{0.5 * kMiB}));
}

// The inter-GPU traffic of a step (2505.22905's "inter-GPU memory traffic"), worked by hand with
// nccl-tests' bus factors: what one rank's link carries.
TEST(Predict, LinkBytesPerStepAreTheStepsMessagesTimesTheirBusFactors) {
  report::MeasuredStep m;
  m.allgather_bytes = {100, 200};
  m.reducescatter_bytes = {300};
  m.buffer_broadcast_bytes = {10};
  m.loss_allreduce_bytes = 8;
  const std::vector<double> buckets = {1000, 3000};
  axes::ParallelPlan fsdp;
  fsdp.sharding = axes::Sharding::kFsdp;
  // 2 ranks, 2 micro-batches: broadcasts 2 x 10 x 1, the loss 8 x 2(1/2), gathers and scatters 2 x 600 x 1/2.
  EXPECT_DOUBLE_EQ(report::link_bytes_per_step(m, fsdp.at(2), buckets, 2), 20 + 8 + 600);
  EXPECT_DOUBLE_EQ(report::link_bytes_per_step(m, fsdp.at(1), buckets, 2), 0);  // one rank: no link
  // Replicated at 4 ranks: the buckets' all-reduce once a step, 4000 x 2(3/4); no gathers.
  axes::ParallelPlan ddp;
  EXPECT_DOUBLE_EQ(report::link_bytes_per_step(m, ddp.at(4), buckets, 2), 20 + 8 * 1.5 + 4000 * 1.5);
}

TEST(Predict, CollectiveCostInterpolatesLogLog) {
  report::CollectiveCost cost("all-reduce", 2, {{1e5, 1e-2}, {1e3, 1e-4}}, "test");
  EXPECT_NEAR(cost.seconds(1e4), 1e-3, 1e-15);  // the log-log midpoint
  EXPECT_DOUBLE_EQ(cost.seconds(500), 1e-4);    // below: the smallest size's time
  EXPECT_NEAR(cost.seconds(2e5), 2e-2, 1e-15);  // above: + the extra bytes at the largest's bandwidth
  report::CollectiveCost one("all-reduce", 1, {{1e3, 1e-4}}, "test");
  EXPECT_EQ(one.seconds(1e6), 0.0);  // nothing to reduce on one rank
  // An assumed link: the bus factor of each collective (nccl-tests'): 2(n-1)/n, (n-1)/n.
  const auto& nvlink = report::link_assumption("h100-nvlink");
  report::CollectiveCost assumed("all-reduce", 4, nvlink);
  EXPECT_NEAR(assumed.seconds(350e6), nvlink.latency_s + 350e6 * 1.5 / (nvlink.busbw_gbs * 1e9), 1e-12);
  report::CollectiveCost gather("all-gather", 4, nvlink);
  EXPECT_NEAR(gather.seconds(350e6), nvlink.latency_s + 350e6 * 0.75 / (nvlink.busbw_gbs * 1e9), 1e-12);
  report::CollectiveCost scatter("reduce-scatter", 3, nvlink);
  EXPECT_NEAR(scatter.seconds(3e6), nvlink.latency_s + 3e6 * 2 / 3 / (nvlink.busbw_gbs * 1e9), 1e-12);
  EXPECT_THROW(report::link_assumption("infiniband"), ConfigError);
}

constexpr auto kDdp = axes::Strategy::kDdp;
constexpr auto kDdpRr = axes::Strategy::kDdpRr;
constexpr auto kDdpDs = axes::Strategy::kDdpDs;

results::RunRecord hand_made_run() {
  results::RunRecord r;
  r.run_id = "base";
  r.file = "hand.h5";
  r.status = "completed";
  r.attributes = {{"task", std::string("image")},
                  {"strategy", std::string("ddp-ds")},
                  {"world_size", std::int64_t{1}},
                  {"train_samples", std::int64_t{1000}},
                  {"batch_size", std::int64_t{50}},
                  {"grad_accum", std::int64_t{1}},
                  {"epochs", std::int64_t{2}},
                  {"max_steps", std::int64_t{0}},
                  {"drop_last", std::string("false")},
                  {"precision", std::string("fp32")},
                  {"trainable_parameters", std::int64_t{1000000}},  // 4 MB of fp32 gradients
                  {"bucket_mb", 25.0},
                  {"first_bucket_mb", 1.0}};
  std::vector<results::EpochRecord> epochs(2);
  for (int e = 0; e < 2; ++e) {
    auto& rec = epochs[static_cast<std::size_t>(e)];
    rec.epoch = e;
    rec.steps = 20;
    rec.train_s = 4.0;
    rec.phases.data_s = 0.2;
    rec.phases.forward_s = 1.0;
    rec.phases.backward_s = 2.0;
    rec.phases.optimizer_s = 0.4;  // the loop's other time: 4.0 - 3.6 = 0.4
    rec.eval_s = 0.5;
  }
  r.epochs.push_back(epochs);
  r.summary.total_s = 10.0;
  r.summary.train_s = 8.0;
  r.summary.eval_s = 1.0;  // start-up: 10 - 8 - 1 = 1
  return r;
}

TEST(Predict, ArithmeticOfAHandMadeRun) {
  const results::RunRecord base = hand_made_run();
  // A link of 1 ms latency and 1 GB/s bus bandwidth: at 2 ranks (factor 1) the buckets of 1 MiB and
  // 4e6 - 1 MiB bytes cost 1 ms + bytes / 1e9 each: 6 ms in all.
  const report::LinkAssumption link{"test", 1e-3, 1.0, "test"};
  std::vector<std::string> notes;
  const auto p = report::predict(base, {}, report::CommCosts{}, &link, {1, 2}, 0, {kDdpDs, kDdpRr, kDdp}, notes);
  ASSERT_EQ(p.size(), 6U);
  // Per step: compute 0.05 + 0.1 + 0.02 + 0.02 (other) = 0.19, data 0.01.
  const auto& one = p[0];
  EXPECT_EQ(one.steps, 20);
  EXPECT_NEAR(one.compute_s, 0.19, 1e-12);
  EXPECT_NEAR(one.total_s, 10.0, 1e-12);  // the model reproduces its own measurement
  const auto& ds = p[1];
  EXPECT_EQ(ds.ranks, 2);
  EXPECT_EQ(ds.steps, 10);
  EXPECT_NEAR(ds.allreduce_s, 0.006, 1e-12);
  EXPECT_NEAR(ds.epoch_s, 10 * (0.19 + 0.01 + 0.006), 1e-12);
  EXPECT_NEAR(ds.total_s, 2 * 2.06 + 2 * 0.25 + 1.0, 1e-12);
  EXPECT_NEAR(ds.speedup, 10.0 / 5.62, 1e-12);
  EXPECT_EQ(ds.limiting, "backward");
  const auto& rr = p[3];  // every rank loads both ranks' batches: data 0.02 per step
  EXPECT_EQ(rr.strategy->name, "ddp-rr");
  EXPECT_NEAR(rr.total_s, 2 * 10 * 0.216 + 2 * 0.25 + 1.0, 1e-12);
  const auto& ddp = p[5];  // no split: 20 steps per rank
  EXPECT_NEAR(ddp.total_s, 2 * 20 * 0.206 + 2 * 0.25 + 1.0, 1e-12);
  // Without a comm run or a link at 3 ranks: skipped, with a note saying how to measure one.
  notes.clear();
  EXPECT_EQ(report::predict(base, {}, report::CommCosts{}, nullptr, {3}, 0, {kDdpDs}, notes).size(), 0U);
  ASSERT_EQ(notes.size(), 1U);
  EXPECT_NE(notes[0].find("mpirun -np 3 mgbench comm"), std::string::npos);
}

// The warm-up (the first step beyond the median of the next ones) is paid once by every rank: out of
// the per-step compute, into the total once, so that the 1-rank prediction still reproduces its run and
// the 2-rank one does not halve it.
TEST(Predict, TheWarmUpIsPaidOnceByEveryRankNotPerStep) {
  results::RunRecord base = hand_made_run();
  base.first_step_s = {0.39, 0.2, 0.19, 0.2, 0.21};  // the next ones' median 0.2: a warm-up of 0.19 s
  const report::LinkAssumption link{"test", 1e-3, 1.0, "test"};
  std::vector<std::string> notes;
  const auto p = report::predict(base, {}, report::CommCosts{}, &link, {1, 2}, 0, {kDdpDs}, notes);
  ASSERT_EQ(p.size(), 2U);
  // Compute over the run: 2 x (1 + 2 + 0.4 + 0.4 other) = 7.6 s, of which 0.19 s is the warm-up.
  const double steady = 0.19 * (1 - 0.19 / 7.6);
  EXPECT_NEAR(p[0].warmup_s, 0.19, 1e-12);
  EXPECT_NEAR(p[0].compute_s, steady, 1e-12);
  EXPECT_NEAR(p[0].total_s, 10.0, 1e-12);
  EXPECT_NEAR(p[1].epoch_s, 10 * (steady + 0.01 + 0.006), 1e-12);
  EXPECT_NEAR(p[1].total_s, 2 * p[1].epoch_s + 0.19 + 2 * 0.25 + 1.0, 1e-12);
  // Two steps recorded are too few to tell a warm-up from a step: none.
  base.first_step_s = {0.39, 0.2};
  const auto two = report::predict(base, {}, report::CommCosts{}, &link, {1}, 0, {kDdpDs}, notes);
  EXPECT_EQ(two[0].warmup_s, 0.0);
  EXPECT_NEAR(two[0].compute_s, 0.19, 1e-12);
}

// --model: forward, backward and evaluation scale with the FLOPs, the optimizer and the gradients'
// bytes with the trained parameters; the data, the loop's other time and the start-up do not.
TEST(Predict, AnotherModelsStepScalesItsComputeAndItsGradients) {
  const results::RunRecord base = hand_made_run();
  report::ModelScaling model;
  model.model = "other";
  model.compute_factor = 3;
  model.optimizer_factor = 2;
  const report::LinkAssumption link{"test", 1e-3, 1.0, "test"};
  std::vector<std::string> notes;
  const auto p = report::predict(base, {}, report::CommCosts{}, &link, {1, 2}, 0, {kDdpDs}, notes, &model);
  ASSERT_EQ(p.size(), 2U);
  // Per step: forward 0.15, backward 0.3, optimizer 0.04, other 0.02; data 0.01; evaluation 1.5 an epoch.
  EXPECT_NEAR(p[0].compute_s, 0.51, 1e-12);
  EXPECT_NEAR(p[0].total_s, 2 * 20 * 0.52 + 2 * 1.5 + 1.0, 1e-12);
  ASSERT_TRUE(p[1].model.has_value());
  EXPECT_EQ(p[1].model->model, "other");
  // 8e6 bytes of gradients at 2 ranks: a 1 MiB bucket and the rest, 1 ms + bytes / 1e9 each.
  EXPECT_NEAR(p[1].allreduce_s, 2e-3 + 8e6 / 1e9, 1e-12);
  const report::MeasuredStep m = report::rescaled(report::measure_step(base), model);
  EXPECT_NEAR(m.gradient_bytes, 8e6, 1e-6);
  EXPECT_NEAR(m.data_s, 0.01, 1e-12);
  EXPECT_NEAR(m.startup_s, 1.0, 1e-12);
}

// The node axis: 2 ranks on one node and 2 ranks on two nodes are priced from the comm run of each
// placement (a faster link inside the node than across); a placement without one is skipped, saying
// how to measure it.
TEST(Predict, EachPlacementIsPricedFromTheCommRunOnAsManyNodes) {
  const results::RunRecord base = hand_made_run();
  // All-reduces: 1 ms flat inside a node, 10 ms flat across two.
  const report::CommCosts costs{{report::CollectiveCost("all-reduce", 2, {{1e3, 1e-3}, {1e8, 1e-3}}, "one node"),
                                 report::CollectiveCost("all-reduce", 2, {{1e3, 1e-2}, {1e8, 1e-2}}, "two nodes", 2)},
                                {},
                                {},
                                {}};
  std::vector<std::string> notes;
  const auto inside = report::predict(base, {}, costs, nullptr, {2}, 0, {kDdpDs}, notes);
  const auto across = report::predict(base, {}, costs, nullptr, {2}, 1, {kDdpDs}, notes);
  ASSERT_EQ(inside.size(), 1U);
  ASSERT_EQ(across.size(), 1U);
  EXPECT_EQ(inside[0].nodes, 1);
  EXPECT_EQ(across[0].nodes, 2);
  EXPECT_EQ(inside[0].comm_source, "one node");
  EXPECT_EQ(across[0].comm_source, "two nodes");
  // Two buckets (1 MiB, the rest) of one all-reduce each.
  EXPECT_NEAR(inside[0].allreduce_s, 2e-3, 1e-12);
  EXPECT_NEAR(across[0].allreduce_s, 2e-2, 1e-12);
  EXPECT_NEAR(across[0].epoch_s - inside[0].epoch_s, 10 * (2e-2 - 2e-3), 1e-12);
  // 4 ranks, 2 a node: 2 nodes, unmeasured.
  EXPECT_TRUE(notes.empty());
  EXPECT_TRUE(report::predict(base, {}, costs, nullptr, {4}, 2, {kDdpDs}, notes).empty());
  ASSERT_EQ(notes.size(), 1U);
  EXPECT_NE(notes[0].find("4 ranks on 2 nodes skipped: no all-reduce measured at 4 ranks on 2 nodes (mpirun -np 4 "
                          "--map-by ppr:2:node mgbench comm --collective all-reduce)"),
            std::string::npos)
      << notes[0];
  // A link assumption stands in across nodes too, saying so.
  notes.clear();
  const report::LinkAssumption link{"test", 1e-3, 1.0, "test"};
  const auto assumed = report::predict(base, {}, costs, &link, {4}, 2, {kDdpDs}, notes);
  ASSERT_EQ(assumed.size(), 1U);
  EXPECT_EQ(assumed[0].nodes, 2);
  ASSERT_EQ(notes.size(), 1U);
  EXPECT_NE(notes[0].find("the assumed link test priced the collectives across nodes too"), std::string::npos);
}

// The gradients' bytes come from the precision's row (amp keeps fp32 gradients); a precision this
// mgbench does not know is refused naming the run and the value, not priced as fp32.
TEST(Predict, GradientBytesFollowThePrecisionRowsAndAnUnknownOneIsRefused) {
  results::RunRecord r = hand_made_run();
  for (const auto& [precision, bytes] : std::vector<std::pair<std::string, double>>{
           {"fp64", 8}, {"fp32", 4}, {"tf32", 4}, {"bf16", 2}, {"fp16", 2}, {"amp-fp16", 4}, {"amp-bf16", 4}}) {
    h5::merge_attributes(r.attributes, {{"precision", precision}});
    EXPECT_EQ(report::measure_step(r).gradient_bytes, 1e6 * bytes) << precision;
  }
  h5::merge_attributes(r.attributes, {{"precision", std::string("fp8")}});
  test::expect_error<ResultsError>([&] { report::measure_step(r); },
                                   {"run base (hand.h5)", "precision 'fp8'", "amp-bf16"});
}

TEST(Predict, OverlapAndStragglersFromAMeasuredMultiRankRun) {
  results::RunRecord two = hand_made_run();
  two.run_id = "two";
  std::vector<results::EpochRecord> rank0(1), rank1(1);
  rank0[0].epoch = rank1[0].epoch = 0;
  rank0[0].train_s = 1.0;
  rank1[0].train_s = 1.5;
  two.step_skew = {12.0, 10.0, 10};  // the slowest rank's steps 1.2x the ranks' mean
  rank0[0].allreduce_window_s = rank1[0].allreduce_window_s = 1.0;
  rank0[0].phases.allreduce_s = 0.2;
  rank1[0].phases.allreduce_s = 0.3;  // 0.5 exposed of a 2.0 window: 75 % hidden
  two.epochs = {rank0, rank1};
  const report::MeasuredStep base_step = report::measure_step(hand_made_run());
  const auto s = report::measure_scaling(base_step, {&two});
  EXPECT_NEAR(s.overlap, 0.75, 1e-12);
  EXPECT_NEAR(s.spread, 1.2, 1e-12);
  // A run under CUDA graphs all-reduces after backward (nothing hidden): left out of the overlap,
  // not of the spread (its ranks equal at every step), which sums the runs' steps.
  results::RunRecord graphs = two;
  graphs.run_id = "graphs";
  h5::merge_attributes(graphs.attributes, {{"cuda_graphs_decision", std::string("on")}});
  for (auto& rank : graphs.epochs) {
    rank[0].phases.allreduce_s = rank[0].allreduce_window_s;
    rank[0].train_s = 2.0;
  }
  graphs.step_skew = {30.0, 30.0, 10};
  const auto both = report::measure_scaling(base_step, {&two, &graphs});
  EXPECT_NEAR(both.overlap, 0.75, 1e-12);
  EXPECT_NEAR(both.spread, (12.0 + 30.0) / (10.0 + 30.0), 1e-12);
  EXPECT_EQ(both.sources, (std::vector<std::string>{"two", "graphs"}));
  EXPECT_NEAR(report::measure_scaling(base_step, {&graphs}).overlap, 0.0, 1e-12);  // unmeasured
  const report::LinkAssumption link{"test", 1e-3, 1.0, "test"};
  std::vector<std::string> notes;
  const results::RunRecord base = hand_made_run();
  const auto p = report::predict(base, {&two}, report::CommCosts{}, &link, {2}, 0, {kDdpDs}, notes);
  ASSERT_EQ(p.size(), 1U);
  EXPECT_NEAR(p[0].allreduce_s, 0.006 * 0.25, 1e-12);
  EXPECT_NEAR(p[0].epoch_s, 10 * (0.2 + 0.0015) * 1.2, 1e-12);
}

// Contention: a measured 2-rank run whose ranks compute 1.1x the base's step outside the collectives,
// data and copies (its first epoch paying the base's warm-up once, 1.1x too) slows the predicted
// compute by 1.1, not the copies; FSDP runs and runs of another CUDA graphs decision are not read
// for it; a prediction never learns from a run of its own placement.
TEST(Predict, ContentionFromTheOtherPlacementsRuns) {
  results::RunRecord base = hand_made_run();
  base.first_step_s = {0.5, 0.2, 0.2, 0.2};  // 0.3 s of warm-up
  for (auto& e : base.epochs.front()) e.phases.h2d_s = 0.1;
  const report::MeasuredStep m = report::measure_step(base);
  ASSERT_GT(m.warmup_s, 0.0);
  const double warmup_device = m.warmup_s * m.device_compute_s() / m.compute_s();
  results::RunRecord two = base;
  two.run_id = "two";
  h5::merge_attributes(two.attributes, {{"world_size", std::int64_t{2}}});
  two.epochs.clear();
  for (int r = 0; r < 2; ++r) {
    std::vector<results::EpochRecord> epochs(2);
    for (std::size_t k = 0; k < 2; ++k) {
      auto& e = epochs[k];
      e.epoch = static_cast<std::int64_t>(k);
      e.steps = 10;
      e.phases.data_s = 0.1;
      e.phases.h2d_s = 0.05;
      e.phases.allreduce_s = 0.05 * (r + 1);
      e.train_s = 1.1 * (10 * m.device_compute_s() + (k == 0 ? warmup_device : 0.0)) + e.phases.data_s +
                  e.phases.h2d_s + e.phases.allreduce_s;
    }
    two.epochs.push_back(epochs);
  }
  EXPECT_NEAR(report::measure_scaling(m, {&two}).contention, 1.1, 1e-12);
  results::RunRecord fsdp = two, graphs = two;
  h5::merge_attributes(fsdp.attributes, {{"sharding", std::string("fsdp")}});
  h5::merge_attributes(graphs.attributes, {{"cuda_graphs_decision", std::string("on")}});
  EXPECT_EQ(report::measure_scaling(m, {&fsdp}).contention, 1.0);
  EXPECT_EQ(report::measure_scaling(m, {&graphs}).contention, 1.0);
  EXPECT_NEAR(report::measure_scaling(m, {&two, &fsdp, &graphs}).contention, 1.1, 1e-12);

  const report::LinkAssumption link{"test", 1e-3, 1.0, "test"};
  std::vector<std::string> notes;
  const auto p = report::predict(base, {&two}, report::CommCosts{}, &link, {1, 2, 4}, 0, {kDdpDs}, notes);
  ASSERT_EQ(p.size(), 3U);
  EXPECT_EQ(p[0].scaling.contention, 1.0);  // 1 rank: its own measurement
  EXPECT_NEAR(p[0].compute_s, m.compute_s(), 1e-12);
  EXPECT_TRUE(p[1].scaling.sources.empty());  // 2 ranks on 1 node: the run measured there is left out
  EXPECT_EQ(p[1].scaling.contention, 1.0);
  EXPECT_NEAR(p[1].compute_s, m.compute_s(), 1e-12);
  EXPECT_EQ(p[2].scaling.sources, std::vector<std::string>{"two"});
  EXPECT_NEAR(p[2].scaling.contention, 1.1, 1e-12);
  EXPECT_NEAR(p[2].compute_s, m.h2d_s + 1.1 * m.device_compute_s(), 1e-12);
  // Spread over nodes, the same 2 ranks are another placement: learnt from the 1-node run.
  const auto nodes = report::predict(base, {&two}, report::CommCosts{}, &link, {2}, 1, {kDdpDs}, notes);
  ASSERT_EQ(nodes.size(), 1U);
  EXPECT_EQ(nodes[0].nodes, 2);
  EXPECT_NEAR(nodes[0].scaling.contention, 1.1, 1e-12);
}

// The plan a run ran with, as the predictor reads it: its sharding and reshard_after_forward, FSDP
// only from 2 ranks on; a sharding this mgbench does not know is refused, naming the run.
TEST(Predict, ReadsTheRunsParallelPlan) {
  results::RunRecord run = hand_made_run();
  EXPECT_EQ(report::parallel_plan_of(run).sharding, axes::Sharding::kNone);  // before --sharding: none
  h5::merge_attributes(run.attributes,
                       {{"sharding", std::string("fsdp")}, {"reshard_after_forward", std::string("false")}});
  const axes::ParallelPlan plan = report::parallel_plan_of(run);
  EXPECT_EQ(plan.sharding, axes::Sharding::kFsdp);
  EXPECT_FALSE(plan.reshard_after_forward);
  EXPECT_FALSE(plan.fully_sharded());  // the 1-rank base
  EXPECT_TRUE(plan.at(2).fully_sharded());
  h5::merge_attributes(run.attributes, {{"sharding", std::string("zero3")}});
  test::expect_error<ResultsError>(
      [&] { report::parallel_plan_of(run); },
      {"run base (hand.h5)", "sharding 'zero3' is not one this mgbench knows (none or fsdp)"});
}

// --sharding fsdp: per micro-batch the all-gathers and reduce-scatters the run recorded, each at
// the measured (or assumed) cost of its size at n ranks, instead of the all-reduce; the optimizer on
// 1/n of the parameters; the share hidden from a measured multi-rank FSDP run's forward + backward.
TEST(Predict, FsdpStepsGatherAndReduceScatterWhatTheRunRecorded) {
  results::RunRecord base = hand_made_run();
  h5::merge_attributes(base.attributes, {{"sharding", std::string("fsdp")},
                                         {"batch_size", std::int64_t{25}},  // 20 steps of 2 x 25 as measured
                                         {"grad_accum", std::int64_t{2}},
                                         {"fsdp_allgather_bytes", std::string("1000,2000,1000")},
                                         {"fsdp_reducescatter_bytes", std::string("500")}});
  // 1 ms + 1 ns a byte at 2 ranks for either collective: gathers 3 ms + 4 us, the scatter 1 ms + 0.5 us.
  const report::CommCosts costs{{},
                                {report::CollectiveCost("all-gather", 2, {{1e3, 1.001e-3}, {1e6, 2e-3}}, "ag")},
                                {report::CollectiveCost("reduce-scatter", 2, {{500, 1.0005e-3}}, "rs")},
                                {}};
  std::vector<std::string> notes;
  const auto p = report::predict(base, {}, costs, nullptr, {1, 2}, 0, {kDdpDs}, notes);
  ASSERT_EQ(p.size(), 2U) << fmt::format("{}", fmt::join(notes, "; "));
  EXPECT_EQ(p[0].allgather_s, 0.0);
  EXPECT_NEAR(p[0].total_s, 10.0, 1e-12);  // 1 rank: the run itself
  const double gathers =
      1.001e-3 +
      std::exp(std::log(1.001e-3) + std::log(2.0) / std::log(1000.0) * (std::log(2e-3) - std::log(1.001e-3))) +
      1.001e-3;
  EXPECT_NEAR(p[1].allgather_s, 2 * gathers, 1e-12);  // two micro-batches a step
  EXPECT_NEAR(p[1].reducescatter_s, 2 * 1.0005e-3, 1e-12);
  EXPECT_EQ(p[1].allreduce_s, 0.0);
  // Steps of 2 x 25 samples: 1000 / 2 ranks / 50 = 10; compute with the optimizer halved (0.02 -> 0.01).
  EXPECT_EQ(p[1].steps, 10);
  EXPECT_NEAR(p[1].compute_s, 0.19 - 0.01, 1e-12);
  EXPECT_NEAR(p[1].epoch_s, 10 * (0.18 + 0.01 + p[1].allgather_s + p[1].reducescatter_s), 1e-12);
  EXPECT_EQ(p[1].comm_source, "all-gather: ag; reduce-scatter: rs");
  // A summed loss's normaliser without an all-reduce measured: predicted without it, noted.
  results::RunRecord summed = base;
  h5::merge_attributes(summed.attributes, {{"loss_allreduce_bytes", std::int64_t{8}}});
  ASSERT_EQ(report::predict(summed, {}, costs, nullptr, {2}, 0, {kDdpDs}, notes).size(), 1U);
  ASSERT_EQ(notes.size(), 1U);
  EXPECT_NE(notes[0].find("the loss normaliser's all-reduce not priced: no all-reduce measured at 2 ranks"),
            std::string::npos)
      << notes[0];
  notes.clear();
  // Without a reduce-scatter at 2 ranks: skipped, saying which collective to measure.
  notes.clear();
  const report::CommCosts gathers_only{{}, costs.all_gather, {}, {}};
  EXPECT_TRUE(report::predict(base, {}, gathers_only, nullptr, {2}, 0, {kDdpDs}, notes).empty());
  ASSERT_EQ(notes.size(), 1U);
  EXPECT_NE(notes[0].find("no reduce-scatter measured at 2 ranks"), std::string::npos) << notes[0];
  // A measured 2-rank FSDP run: per step forward + backward 0.17 s against the base's 0.15, its
  // collectives' windows 0.08 s a step: 0.02 exposed of 0.08, 75 % hidden.
  results::RunRecord two = base;
  two.run_id = "two";
  results::EpochRecord e;
  e.steps = 5;
  e.train_s = 1.0;
  e.phases.forward_s = 5 * 0.06;
  e.phases.backward_s = 5 * 0.11;
  e.allgather_s = 5 * 0.06;
  e.reducescatter_s = 5 * 0.02;
  two.epochs = {{e}, {e}};
  EXPECT_NEAR(report::measure_fsdp_overlap(report::measure_step(base), {&two}), 0.75, 1e-12);
  {
    // With a warm-up: each rank pays its forward and backward share once, in its first epoch -- not
    // exposed collective time. The steady step then also leaves the same 75 % hidden.
    results::RunRecord warm = base;
    warm.first_step_s = {0.5, 0.2, 0.2, 0.2};
    const report::MeasuredStep m = report::measure_step(warm);
    ASSERT_GT(m.warmup_s, 0.0);
    const double compute = m.compute_s();
    results::RunRecord paid = two;
    for (auto& rank : paid.epochs) {
      rank[0].phases.forward_s = 5 * m.forward_s + m.warmup_s * (m.forward_s + m.backward_s) / compute;
      rank[0].phases.backward_s = 5 * m.backward_s + 5 * 0.02;  // 0.02 a step exposed, as above
    }
    EXPECT_NEAR(report::measure_fsdp_overlap(m, {&paid}), 0.75, 1e-9);
  }
  const auto hidden = report::predict(base, {&two}, costs, nullptr, {2}, 0, {kDdpDs}, notes);
  ASSERT_EQ(hidden.size(), 1U);
  EXPECT_NEAR(hidden[0].allgather_s, 0.25 * p[1].allgather_s, 1e-12);
  // A damaged list is refused naming the run and the attribute.
  h5::merge_attributes(base.attributes, {{"fsdp_allgather_bytes", std::string("1000,x")}});
  test::expect_error<ResultsError>([&] { report::measure_step(base); }, {"run base", "fsdp_allgather_bytes", "1000,x"});
  base.attributes.erase(std::find_if(base.attributes.begin(), base.attributes.end(),
                                     [](const auto& a) { return a.first == "fsdp_allgather_bytes"; }));
  test::expect_error<ResultsError>([&] { report::measure_step(base); }, {"no fsdp_allgather_bytes"});
}

TEST(Predict, BufferBroadcastsAndTheLossNormaliserArePricedAtTheirSizes) {
  results::RunRecord base = hand_made_run();
  h5::merge_attributes(base.attributes, {{"batch_size", std::int64_t{25}},  // 20 steps of 2 x 25 as measured
                                         {"grad_accum", std::int64_t{2}},
                                         {"buffer_broadcast_bytes", std::string("2000,8")},
                                         {"loss_allreduce_bytes", std::int64_t{8}}});
  // 1 ms + 1 ns a byte at 2 ranks (both bus factors 1): two micro-batches of a 2000 B and an 8 B
  // broadcast, one 8 B all-reduce a step.
  const report::LinkAssumption link{"test", 1e-3, 1.0, "test"};
  std::vector<std::string> notes;
  const auto p = report::predict(base, {}, report::CommCosts{}, &link, {1, 2}, 0, {kDdpDs}, notes);
  ASSERT_EQ(p.size(), 2U) << fmt::format("{}", fmt::join(notes, "; "));
  EXPECT_EQ(p[0].buffer_broadcast_s, 0.0);  // 1 rank: nothing to broadcast
  EXPECT_EQ(p[0].loss_reduce_s, 0.0);
  EXPECT_NEAR(p[0].total_s, 10.0, 1e-12);
  EXPECT_NEAR(p[1].buffer_broadcast_s, 2 * (1e-3 + 2000e-9 + 1e-3 + 8e-9), 1e-15);
  EXPECT_NEAR(p[1].loss_reduce_s, 1e-3 + 8e-9, 1e-15);
  EXPECT_NEAR(p[1].epoch_s, 10 * (0.19 + 0.01 + p[1].allreduce_s + p[1].buffer_broadcast_s + p[1].loss_reduce_s),
              1e-12);
  // Measured all-reduce but no broadcast at 2 ranks (`mgbench comm`'s default): predicted without
  // the broadcast, a note saying so and what to measure.
  notes.clear();
  const report::CommCosts no_broadcast{
      {report::CollectiveCost("all-reduce", 2, {{8, 1e-5}, {4e6, 1e-3}}, "ar")}, {}, {}, {}};
  const auto unpriced = report::predict(base, {}, no_broadcast, nullptr, {2}, 0, {kDdpDs}, notes);
  ASSERT_EQ(unpriced.size(), 1U);
  EXPECT_EQ(unpriced[0].buffer_broadcast_s, 0.0);
  EXPECT_NEAR(unpriced[0].loss_reduce_s, 1e-5, 1e-15);
  ASSERT_EQ(notes.size(), 1U);
  EXPECT_NE(notes[0].find("broadcasts not priced: no broadcast measured at 2 ranks"), std::string::npos) << notes[0];
}

// The straggler wait, step by step: each step row's slowest own time (step_s less every collective
// phase) against the ranks' mean, rows some rank did not write left out; nothing at 1 rank.
TEST(Predict, StepSkewSumsEachStepsSlowestRank) {
  results::StepSkewSum sum;
  // Step 0: rank 0 waited 0.4 s for rank 1 in the broadcasts and the loss normaliser: own 0.6 and 1.0.
  // Step 1: rank 1 the faster. Step 2: rank 1 did not write it (stopped).
  sum.add_rank({{0, 1.0, 0.4}, {0, 0.5, 0.0}, {0, 0.7, 0.0}});
  sum.add_rank({{0, 1.0, 0.0}, {0, 0.5, 0.2}, {-1, 0.0, 0.0}});
  const results::StepSkew skew = sum.result();
  EXPECT_EQ(skew.steps, 2);
  EXPECT_NEAR(skew.slowest_s, 1.0 + 0.5, 1e-12);
  EXPECT_NEAR(skew.mean_s, 0.8 + 0.4, 1e-12);
  results::StepSkewSum one;
  one.add_rank({{0, 1.0, 0.0}});
  EXPECT_EQ(one.result().steps, 0);
  // The predictor's spread: the sums' ratio.
  results::RunRecord two = hand_made_run();
  two.step_skew = skew;
  EXPECT_NEAR(report::measure_scaling(report::measure_step(hand_made_run()), {&two}).spread, 1.5 / 1.2, 1e-12);
}

}  // namespace
}  // namespace mgbench
