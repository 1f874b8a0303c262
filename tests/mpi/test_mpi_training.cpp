// Distributed behaviour, run under `mpirun -np 2` and `-np 3` (ctest label mpi).
#include <mpi.h>
#include <torch/torch.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "../unit/linear_recipe.h"
#include "core/error.h"
#include "core/progress.h"
#include "mpi_support.h"
#include "results/reader.h"
#include "results/schema.h"
#include "results/writer.h"
#include "runtime/communicator.h"
#include "runtime/grad_sync.h"
#include "runtime/mpi_communicator.h"
#include "runtime/mpi_env.h"
#include "session/session.h"
#include "train/job_config.h"
#include "train/loop.h"
#include "train/optim/optimizer.h"

namespace mgbench {
namespace {

using namespace test;  // NOLINT: the mpi test helpers

TEST(Communicator, AllReduceAndBroadcast) {
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  const int n = comm.world_size();
  torch::Tensor a = torch::full({1000}, static_cast<double>(comm.rank() + 1), torch::kFloat64);
  torch::Tensor b = torch::full({3}, static_cast<std::int64_t>(comm.rank()), torch::kInt64);
  auto wa = comm.all_reduce(a, runtime::ReduceOp::kSum);  // two collectives in flight at once
  auto wb = comm.all_reduce(b, runtime::ReduceOp::kMax);
  wb->wait();
  wa->wait();
  EXPECT_TRUE(torch::all(a == n * (n + 1) / 2.0).item<bool>());
  EXPECT_TRUE(torch::all(b == n - 1).item<bool>());
  torch::Tensor c = torch::full({5}, static_cast<float>(comm.rank()), torch::kFloat32);
  comm.broadcast(c, n - 1)->wait();
  EXPECT_TRUE(torch::all(c == static_cast<float>(n - 1)).item<bool>());
}

// The collectives `mgbench comm` measures, out of place and in place (NCCL's layout), with a dtype
// MPI stages through float32: rank r holds r * 10 + i at element i.
TEST(Communicator, GatherScatterAndOutOfPlaceCollectives) {
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  const int n = comm.world_size();
  const int r = comm.rank();
  for (const auto dtype : {torch::kFloat64, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const auto opts = torch::TensorOptions().dtype(dtype);
    const torch::Tensor mine = torch::arange(4, opts) + r * 10;  // [4]
    // all-gather, out of place: rank q's block at q * 4.
    torch::Tensor gathered = torch::zeros({4 * n}, opts);
    comm.all_gather(mine, gathered)->wait();
    for (int q = 0; q < n; ++q) {
      EXPECT_TRUE(torch::equal(gathered.narrow(0, 4 * q, 4), torch::arange(4, opts) + q * 10)) << "rank " << q;
    }
    // all-gather in place: the input is this rank's slice of the output.
    torch::Tensor buffer = torch::full({4 * n}, -1, opts);
    buffer.narrow(0, 4 * r, 4).copy_(mine);
    torch::Tensor slice = buffer.narrow(0, 4 * r, 4);
    comm.all_gather(slice, buffer)->wait();
    EXPECT_TRUE(torch::equal(buffer, gathered));
    // reduce-scatter: rank r gets slice r of the sum of every rank's [4 * n] input.
    const torch::Tensor input = torch::arange(4 * n, opts) + r;  // element j: j + r
    const double rank_sum = n * (n - 1) / 2.0;
    const torch::Tensor expected = (torch::arange(4, torch::kFloat64) + 4 * r) * n + rank_sum;
    torch::Tensor part = torch::zeros({4}, opts);
    comm.reduce_scatter(input, part, runtime::ReduceOp::kSum)->wait();
    EXPECT_TRUE(torch::equal(part.to(torch::kFloat64), expected));
    torch::Tensor whole = input.clone();  // in place: the output is this rank's slice of the input
    torch::Tensor own = whole.narrow(0, 4 * r, 4);
    comm.reduce_scatter(whole, own, runtime::ReduceOp::kSum)->wait();
    EXPECT_TRUE(torch::equal(own.to(torch::kFloat64), expected));
    // all-reduce and broadcast out of place leave the input alone.
    torch::Tensor reduced = torch::zeros({4}, opts);
    comm.all_reduce(mine, reduced, runtime::ReduceOp::kMax)->wait();
    EXPECT_TRUE(torch::equal(reduced, torch::arange(4, opts) + (n - 1) * 10));
    EXPECT_TRUE(torch::equal(mine, torch::arange(4, opts) + r * 10));
    torch::Tensor received = torch::zeros({4}, opts);
    comm.broadcast(mine, received, n - 1)->wait();
    EXPECT_TRUE(torch::equal(received, torch::arange(4, opts) + (n - 1) * 10));
  }
  // Mismatched sizes are refused, naming the collective.
  torch::Tensor wrong = torch::zeros({3});
  try {
    comm.all_gather(torch::zeros({2}), wrong);
    ADD_FAILURE() << "all_gather accepted an output of the wrong size";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather"), std::string::npos) << e.what();
  }
}

// A Work that completed holds none of the collective's buffers: FSDP keeps its Works to the end of
// the step (for their seconds), and with them every unit's float32 staging of a bf16 gather and
// reduce-scatter stayed alive at once (issue 48: fsdp bf16 1.36x the replicated run's peak RSS).
TEST(Communicator, ACompletedWorkHoldsNoBuffers) {
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  const int n = comm.world_size();
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const torch::Tensor mine = torch::ones({1024}, dtype);
    torch::Tensor gathered = torch::empty({1024 * n}, dtype);
    const auto gather = comm.all_gather(mine, gathered);
    gather->wait();
    const torch::Tensor whole = torch::ones({1024 * n}, dtype);
    torch::Tensor part = torch::empty({1024}, dtype);
    const auto reduce = comm.reduce_scatter(whole, part, runtime::ReduceOp::kSum);
    reduce->wait();
    // The Works are alive; only the caller refers to its tensors.
    EXPECT_EQ(gathered.use_count(), 1);
    EXPECT_EQ(mine.use_count(), 1);
    EXPECT_EQ(part.use_count(), 1);
    EXPECT_EQ(whole.use_count(), 1);
    EXPECT_TRUE(torch::all(part == static_cast<float>(n)).item<bool>());
    EXPECT_GE(reduce->seconds_since_start_of(*gather), 0.0);  // and still answer for their times
  }
}

// A collective of more than the communication thread's 8 MiB segment a rank runs as several MPI
// calls over pieces of every rank's block, the last one shorter: each op, in and out of place,
// float32 (MPI reads the caller's memory where a piece is contiguous) and bfloat16 (staged), with
// values a bf16 holds exactly.
TEST(Communicator, CollectivesLargerThanASegmentRunInPieces) {
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  const int n = comm.world_size();
  const int r = comm.rank();
  const std::int64_t k = (std::int64_t{5} << 20) + 12345;  // elements a rank: 20 MiB in fp32
  const torch::Tensor pattern = torch::arange(k, torch::kInt64).remainder(61);
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const auto opts = torch::TensorOptions().dtype(dtype);
    const torch::Tensor mine = (pattern + r).to(dtype);  // [k]
    torch::Tensor gathered = torch::empty({n * k}, opts);
    comm.all_gather(mine, gathered)->wait();
    torch::Tensor buffer = torch::zeros({n * k}, opts);  // in place: mine is the rank's block
    buffer.narrow(0, r * k, k).copy_(mine);
    torch::Tensor own_block = buffer.narrow(0, r * k, k);
    comm.all_gather(own_block, buffer)->wait();
    for (int q = 0; q < n; ++q) {
      const torch::Tensor expected = (pattern + q).to(dtype);
      EXPECT_TRUE(torch::equal(gathered.narrow(0, q * k, k), expected)) << "rank " << q;
      EXPECT_TRUE(torch::equal(buffer.narrow(0, q * k, k), expected)) << "rank " << q << ", in place";
    }
    // reduce-scatter of [rank q's pattern + q + r] over q: rank r gets n * pattern + n * r + n(n-1)/2.
    const torch::Tensor input = torch::cat({gathered}).add_(r);
    const torch::Tensor summed = (pattern * n + (n * r + n * (n - 1) / 2)).to(dtype);
    torch::Tensor part = torch::empty({k}, opts);
    comm.reduce_scatter(input, part, runtime::ReduceOp::kSum)->wait();
    EXPECT_TRUE(torch::equal(part, summed));
    torch::Tensor own = input.narrow(0, r * k, k);  // NCCL's in-place layout
    comm.reduce_scatter(input, own, runtime::ReduceOp::kSum)->wait();
    EXPECT_TRUE(torch::equal(own, summed));
    // all-reduce: the sum over ranks, out of place (the input left alone) and in place.
    torch::Tensor reduced = torch::empty({k}, opts);
    comm.all_reduce(mine, reduced, runtime::ReduceOp::kSum)->wait();
    const torch::Tensor all = (pattern * n + n * (n - 1) / 2).to(dtype);
    EXPECT_TRUE(torch::equal(reduced, all));
    EXPECT_TRUE(torch::equal(mine, (pattern + r).to(dtype)));
    comm.all_reduce(reduced, runtime::ReduceOp::kMax)->wait();
    EXPECT_TRUE(torch::equal(reduced, all));
    torch::Tensor broadcast = mine.clone();
    comm.broadcast(broadcast, n - 1)->wait();
    EXPECT_TRUE(torch::equal(broadcast, (pattern + n - 1).to(dtype)));
  }
}

/// This process's resident memory [bytes]: now (VmRSS) or its peak since the last reset (VmHWM).
std::int64_t resident_bytes(const char* field) {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(std::strlen(field) + 1)) * 1024;  // kB
  }
  throw std::runtime_error(fmt::format("/proc/self/status has no {}", field));
}

// Issue 48: a bf16 collective adds a few 8 MiB segments of host memory, not multiples of the tensor.
// Before, MPI got whole fp32 copies and Open MPI's non-blocking reduce-scatter and all-reduce kept
// temporaries of about twice those: 0.5 GiB a rank for a bf16 Llama's 128k-vocabulary head at 2
// ranks, several in flight at once. The oracle is the kernel's peak of the process's resident memory
// (VmHWM, reset through /proc/self/clear_refs), so MPI's own allocations count too.
TEST(Communicator, ABf16CollectiveAddsSegmentsNotCopiesOfTheTensor) {
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  const int n = comm.world_size();
  const std::int64_t k = std::int64_t{32} << 20;  // 64 MiB of bf16 a rank
  const torch::Tensor input = torch::ones({n * k}, torch::kBFloat16);
  torch::Tensor part = torch::zeros({k}, torch::kBFloat16);
  torch::Tensor gradient = torch::ones({k}, torch::kBFloat16);
  comm.barrier();  // (the communicator's thread and MPI's connections set up)
  std::ofstream("/proc/self/clear_refs") << "5";
  const std::int64_t before = resident_bytes("VmRSS:");
  auto reduce = comm.reduce_scatter(input, part, runtime::ReduceOp::kSum);
  auto all_reduce = comm.all_reduce(gradient, runtime::ReduceOp::kSum);  // in flight together
  reduce->wait();
  all_reduce->wait();
  const std::int64_t added = resident_bytes("VmHWM:") - before;
  EXPECT_TRUE(torch::all(part == static_cast<float>(n)).item<bool>());
  EXPECT_TRUE(torch::all(gradient == static_cast<float>(n)).item<bool>());
  EXPECT_LE(added, std::int64_t{64} << 20)
      << "the collectives added " << (added >> 20) << " MiB; the input is " << (input.nbytes() >> 20) << " MiB";
}

// Both ways of holding the gradients (DDP's gradient_as_bucket_view false and true) and both ways
// of launching the buckets (hooks during backward; after backward without hooks, as under CUDA
// graphs) average them alike, three steps in a row whose gradients differ; with bucket views each
// gradient is a slice of a bucket (one storage for the bucket's parameters) and
// train::set_gradients_to_none drops them where LibTorch's zero_grad throws (the eager step's
// way; under graphs the step zeroes them in place, train::zero_gradients). Without hooks no
// prepare() is called, as a replayed step calls none: finish() must take every gradient in afresh
// (a stale readiness would all-reduce the buckets' previous means).
class GradSyncViews : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(GradSyncViews, AveragesGradientsOverRanks) {
  const auto [as_bucket_view, launch_in_backward] = GetParam();
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  torch::manual_seed(0);  // same weights everywhere
  torch::nn::Linear a(40, 300), b(300, 7);
  std::vector<torch::Tensor> params = a->parameters();
  for (const auto& p : b->parameters()) params.push_back(p);
  runtime::GradSyncOptions options;
  options.first_bucket_bytes = 1024;
  options.bucket_bytes = 16 * 1024;
  options.gradient_as_bucket_view = as_bucket_view;
  options.launch_in_backward = launch_in_backward;
  runtime::GradSync sync(params, comm, options);
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.0));
  torch::manual_seed(0);
  torch::nn::Linear a0(40, 300), b0(300, 7);
  b0->forward(a0->forward(torch::ones({2, 40}))).sum().backward();
  const int n = comm.world_size();
  // Without hooks (CUDA graphs) a gradient keeps its address from the first backward on -- with
  // bucket views from the start -- since a graph captured then adds into it: zeroed in place.
  if (!launch_in_backward) {
    EXPECT_EQ(a->weight.grad().defined(), as_bucket_view);
  }
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    if (launch_in_backward) {
      train::set_gradients_to_none(sgd);
    } else {
      train::zero_gradients(sgd);
    }
    // Rank r sees input scaled by (r + 1)(step + 1): its first layer's gradients are (r + 1)(step + 1)
    // x rank 0's first step's for the linear loss.
    const torch::Tensor x = torch::ones({2, 40}) * static_cast<float>((comm.rank() + 1) * (step + 1));
    if (launch_in_backward) sync.prepare();
    b->forward(a->forward(x)).sum().backward();
    EXPECT_EQ(sync.buckets_launched_in_backward() > 0, launch_in_backward);
    const void* accumulated_into = a->weight.grad().data_ptr();
    sync.finish();
    if (!launch_in_backward) {
      EXPECT_EQ(a->weight.grad().data_ptr(), accumulated_into);
    }
    // mean over ranks of (r + 1) for the first layer's weight gradient = (n + 1) / 2 x rank 0's.
    EXPECT_TRUE(torch::allclose(a->weight.grad(), a0->weight.grad() * ((n + 1) / 2.0 * (step + 1)), 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(b->bias.grad(), b0->bias.grad(), 1e-6, 1e-6));
    // b's weight and bias fill one 16 KiB bucket: views of one storage, or gradients of their own.
    EXPECT_EQ(b->weight.grad().is_alias_of(b->bias.grad()), as_bucket_view);
  }
  if (as_bucket_view) {
    EXPECT_THROW(sgd.zero_grad(), c10::Error);  // why set_gradients_to_none exists
  }
}

INSTANTIATE_TEST_SUITE_P(AsBucketViewLaunchInBackward, GradSyncViews,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

// A rank whose device fails to initialise ends the set-up on every rank in that stage, before any
// rank enters the communicator's creation (NCCL's unique-id broadcast has no deadline: a rank that
// failed on its way there left its peers waiting until --comm-timeout). The failure is injected:
// the CPU has no CUDA context to refuse.
TEST(Connect, ADeviceThatFailsToInitialiseOnOneRankEndsTheSetUpOnEveryRank) {
  static int argc = 0;
  static char** argv = nullptr;
  static runtime::MpiEnvironment env(&argc, &argv);  // MPI is already initialised by the test main
  const auto start = std::chrono::steady_clock::now();
  session::Connection failed = session::connect(env, runtime::DeviceRequest::kCpu, runtime::Backend::kMpi, 60,
                                                [](const runtime::DevicePlacement& placement) {
                                                  EXPECT_FALSE(placement.is_cuda());
                                                  if (world_rank() == world_size() - 1)
                                                    throw Error("injected: the GPU refused a context");
                                                });
  EXPECT_EQ(failed.comm, nullptr) << "rank " << world_rank();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  // Without the failure the same call connects.
  session::Connection ok = session::connect(env, runtime::DeviceRequest::kCpu, runtime::Backend::kMpi, 60);
  ASSERT_NE(ok.comm, nullptr);
  EXPECT_EQ(ok.comm->world_size(), world_size());
}

// fp16 gradients are divided by the world size before the sum (PyTorch's DDP): every rank's
// 60000 averages to 60000, where a sum first overflows fp16's 65504 into inf.
TEST(GradSync, Fp16GradientsAreDividedBeforeTheSum) {
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  torch::Tensor w = torch::zeros({8}, torch::TensorOptions().dtype(torch::kHalf).requires_grad(true));
  runtime::GradSync sync({w}, comm, runtime::GradSyncOptions{});
  sync.prepare();
  (w.to(torch::kFloat32) * 60000.0F).sum().backward();
  sync.finish();
  ASSERT_EQ(w.grad().scalar_type(), torch::kHalf);
  EXPECT_TRUE(torch::isfinite(w.grad()).all().item<bool>()) << w.grad();
  EXPECT_TRUE(torch::allclose(w.grad().to(torch::kFloat32), torch::full({8}, 60000.0F), 1e-3, 0)) << w.grad();
}

TEST(Training, ParametersAndBuffersIdenticalOnAllRanks) {
  MGBENCH_REQUIRE_INPUTS(test::mnist_dir());
  SharedDir dir;
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  for (const std::string strategy : {"ddp", "ddp-rr", "ddp-ds"}) {
    const Trained t = train_run(MPI_COMM_WORLD, *small_config(strategy, 8), dir.file("identical.h5"));
    EXPECT_EQ(max_difference_across_ranks(comm, flat(t.parameters)), 0.0) << strategy;
    EXPECT_EQ(max_difference_across_ranks(comm, flat(t.buffers)), 0.0) << strategy;
  }
  if (world_rank() == 0) {
    const auto runs = results::read_runs(dir.file("identical.h5"));
    ASSERT_EQ(runs.size(), 3u);
    for (const auto& run : runs) {
      EXPECT_EQ(run.status, "completed");
      EXPECT_EQ(static_cast<int>(run.epochs.size()), world_size());
    }
  }
}

TEST(Training, DdpDsEqualsOneRankWithWorldTimesTheBatch) {
  MGBENCH_REQUIRE_INPUTS(test::mnist_dir());
  SharedDir dir;
  // fp64, frozen BatchNorm (per-sample maths independent of the batch) and no dropout: the
  // only difference left is the order of floating-point sums.
  const Settings exact{{"precision", "fp64"}, {"freeze-batchnorm", "true"}, {"dropout", "0"}};
  const Trained distributed = train_run(MPI_COMM_WORLD, *small_config("ddp-ds", 8, exact), dir.file("ds.h5"));
  if (world_rank() == 0) {
    const Trained reference =
        train_run(MPI_COMM_SELF, *small_config("ddp-ds", 8 * world_size(), exact), dir.file("single.h5"));
    const torch::Tensor a = flat(distributed.parameters);
    const torch::Tensor b = flat(reference.parameters);
    const double max_diff = (a - b).abs().max().item<double>();
    // Tolerance: 1e-10 absolute on parameters of order 0.01-1 after 2 x 96 / (8 x world) steps.
    EXPECT_LT(max_diff, 1e-10) << "max |param(" << world_size() << " ranks x 8) - param(1 rank x " << 8 * world_size()
                               << ")| = " << max_diff;
    // And the comparison is not vacuous: a different global batch gives different parameters.
    const Trained different =
        train_run(MPI_COMM_SELF, *small_config("ddp-ds", 8 * world_size() / 2, exact), dir.file("other.h5"));
    EXPECT_GT((flat(different.parameters) - b).abs().max().item<double>(), 1e-6);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// On more than one rank a summed loss's normaliser is summed and kept on the device (train/update.cpp):
// the gradients' factor and a step without targets' skip reach the optimizer as tensors. The ranks
// then train as one rank with their whole batch does, whose count the host reads: step 2 has no
// target on any rank (skipped: had the model or the optimizer's moments or step counts moved, the
// later steps would part from the oracle's -- AdamW and SGD with momentum move on zero gradients),
// step 3 none on rank 0 (its zero count summed with the others'). Each path of the step: the fused
// AdamW's divisor and skip in its kernel, the factor by the unscale kernel before clipping, in
// float64 for float64 gradients, and SGD reading the skip on the host.
TEST(TrainingLoop, ANormaliserSummedOnTheDeviceTrainsAsOneRankAndSkipsAStepWithoutTargets) {
  SharedDir dir;
  const std::int64_t n = world_size(), b = 2;
  struct Case {
    const char* name;
    train::OptimizerKind optimizer;
    double clip;
    torch::Dtype dtype;
    double tolerance;  // on parameters of order 0.1-1: fp32's sums in another order, fp64's
  };
  for (const Case& c : {Case{"adamw fp32", train::OptimizerKind::kAdamW, 0, torch::kFloat32, 1e-5},
                        Case{"adamw fp32 clipped", train::OptimizerKind::kAdamW, 0.05, torch::kFloat32, 1e-5},
                        Case{"adamw fp64", train::OptimizerKind::kAdamW, 0, torch::kFloat64, 1e-12},
                        Case{"sgd fp32 momentum", train::OptimizerKind::kSgd, 0, torch::kFloat32, 1e-5}}) {
    SCOPED_TRACE(c.name);
    LinearRecipeOptions o;
    o.normalization = train::LossNormalization::kSumOverTargets;
    o.samples = 48;  // divisible by 2 x 2 and 3 x 2: every batch full
    o.dtype = c.dtype;
    o.masked = {n * b, 2 * n * b};  // step 2, all ranks (DistributedSampler: rank r's step k is r + n (k b + j))
    o.masked_too = {2 * n * b, 2 * n * b + n};  // rank 0's two samples of step 3
    auto options = [&](std::int64_t batch_size, const std::string& results) {
      train::TrainOptions t = linear_options(results);
      t.optim.optimizer = c.optimizer;
      t.optim.momentum = 0.9;
      t.optim.weight_decay = 0.01;
      t.optim.clip_grad_norm = c.clip;
      t.batch_size = batch_size;
      return t;
    };
    LinearRecipe ranks(o);
    const torch::Tensor distributed = train_linear(ranks, options(b, dir.file("ranks.h5")), MPI_COMM_WORLD);
    if (world_rank() == 0) {
      LinearRecipe one(o);
      const torch::Tensor reference = train_linear(one, options(n * b, dir.file("one.h5")), MPI_COMM_SELF);
      const double diff = (distributed - reference).abs().max().item<double>();
      EXPECT_LT(diff, c.tolerance) << "max |param(" << n << " ranks x " << b << ") - param(1 rank x " << n * b << ")|";
      const results::EpochRecord e = results::read_runs(dir.file("ranks.h5")).back().epochs[0][0];
      const results::EpochRecord r = results::read_runs(dir.file("one.h5")).back().epochs[0][0];
      EXPECT_EQ(e.steps, 48 / (n * b));
      EXPECT_EQ(e.skipped_steps, 1);
      EXPECT_EQ(r.skipped_steps, 1);
      // Not vacuous: step 2 with its targets gives other parameters, far beyond the tolerance.
      LinearRecipeOptions unmasked = o;
      unmasked.masked = {0, 0};
      LinearRecipe other(unmasked);
      const torch::Tensor learned = train_linear(other, options(n * b, dir.file("other.h5")), MPI_COMM_SELF);
      EXPECT_GT((learned - reference).abs().max().item<double>(), 100 * c.tolerance);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) {
      std::filesystem::remove(dir.file("ranks.h5"));
      std::filesystem::remove(dir.file("one.h5"));
      std::filesystem::remove(dir.file("other.h5"));
    }
  }
}

TEST(Training, HostUpscaleEqualsDeviceUpscale) {
  MGBENCH_REQUIRE_INPUTS(test::mnist_dir());
  SharedDir dir;
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  const Settings fp64{{"precision", "fp64"}, {"epochs", "1"}};
  const Trained device = train_run(MPI_COMM_WORLD, *small_config("ddp-ds", 8, fp64), dir.file("upscale.h5"));
  auto host_config = small_config("ddp-ds", 8, fp64);
  host_config->set("upscale", "host");
  const Trained host = train_run(MPI_COMM_WORLD, *host_config, dir.file("upscale.h5"));
  // The same function on the same values, only on another thread: bit-identical.
  EXPECT_EQ((flat(device.parameters) - flat(host.parameters)).abs().max().item<double>(), 0.0);
}

TEST(Training, MixedPrecisionKeepsRanksInStep) {
  MGBENCH_REQUIRE_INPUTS(test::mnist_dir());
  SharedDir dir;
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  for (const std::string precision : {"bf16", "amp-bf16", "amp-fp16"}) {
    const Trained t = train_run(MPI_COMM_WORLD, *small_config("ddp-ds", 8, {{"precision", precision}, {"epochs", "1"}}),
                                dir.file("amp.h5"));
    EXPECT_EQ(max_difference_across_ranks(comm, flat(t.parameters)), 0.0) << precision;
    const auto dtype = t.parameters.front().scalar_type();
    EXPECT_EQ(dtype, precision == "bf16" ? torch::kBFloat16 : torch::kFloat32)
        << precision;  // amp: fp32 master weights
  }
  if (world_rank() == 0) {
    const auto runs = results::read_runs(dir.file("amp.h5"));
    ASSERT_EQ(runs.size(), 3u);
    EXPECT_EQ(runs[2].text("precision").value_or(""), "amp-fp16");
  }
}

// LLM: N ranks x batch b equals 1 rank x batch N*b (token-weighted loss), adapters identical on all ranks.
struct LlmTrained {
  std::vector<torch::Tensor> adapters;
  std::vector<double> losses;
};

LlmTrained tune(MPI_Comm comm_world, train::JobConfig& config) {
  LlmTrained out;
  for (const auto& p : train_run(comm_world, config, config.train.results).parameters) {
    out.adapters.push_back(p.detach().clone());
  }
  return out;
}

/// Every fine-tuning recipe: N ranks x batch 2 trains what 1 rank x batch 2N trains (fp32; fp64 for
/// QAT; NF4 has no fp64), and the trained tensors are identical on all ranks.
class LlmTuning : public ::testing::TestWithParam<const char*> {};

TEST_P(LlmTuning, RanksTimesBatchEqualsOneRankWithTheWholeBatch) {
  const std::string recipe = GetParam();
  const std::string model = test::oracle_dir() + (recipe == "qlora" ? "/llama_tiny_nf4" : "/llama_tiny_2256");
  MGBENCH_REQUIRE_INPUTS(test::llm_inputs(model));
  SharedDir dir;
  // QAT in fp64 (torchao's fake quantisation allows it): in fp32 the order of the gradient sums
  // flips an int4 rounding now and then, and a full-QAT weight then moves by a whole AdamW step.
  // Groups of 32 in-features: the tiny model's 64 and 128 split into them.
  const bool qat = recipe.starts_with("qat");
  Settings more = qat ? Settings{{"qat-group-size", "32"}, {"precision", "fp64"}} : Settings{};
  // The NF4 oracle's projections hold 4 and 8 quantisation blocks: FSDP shards them over 2 or 4
  // ranks, not 3 (whole blocks, evenly, as torchao); there the replicated run is compared.
  if (recipe == "qlora" && 4 % world_size() != 0) more.emplace_back("sharding", "none");
  const LlmTrained distributed = tune(MPI_COMM_WORLD, *llm_config(recipe, model, 2, dir.file("llm.h5"), more));
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  EXPECT_EQ(max_difference_across_ranks(comm, flat(distributed.adapters)), 0.0);
  if (world_rank() == 0) {
    // A summed (token-weighted) loss: its normaliser is all-reduced each step, a phase of its own;
    // no buffers are broadcast; the gradients' all-reduce is the only allreduce phase (none: FSDP).
    const auto runs = results::read_runs(dir.file("llm.h5"));
    ASSERT_EQ(runs.size(), 1U);
    EXPECT_EQ(runs[0].integer("loss_allreduce_bytes").value_or(-1), 8);
    EXPECT_EQ(runs[0].text("buffer_broadcast_bytes").value_or("?"), "");
    const bool fsdp = runs[0].text("sharding").value_or("") == "fsdp";
    for (const auto& rank : runs[0].epochs) {
      for (const auto& epoch : rank) {
        EXPECT_GT(epoch.phases.loss_reduce_s, 0.0);
        EXPECT_EQ(epoch.phases.buffer_broadcast_s, 0.0);
        if (fsdp) {
          EXPECT_EQ(epoch.phases.allreduce_s, 0.0);
        }
      }
    }
    const LlmTrained reference =
        tune(MPI_COMM_SELF, *llm_config(recipe, model, 2 * world_size(), dir.file("llm1.h5"), more));
    const double diff = (flat(distributed.adapters) - flat(reference.adapters)).abs().max().item<double>();
    // Only the order of the gradient sums differs (fp32: tolerance well under one AdamW step of 1e-3).
    EXPECT_LT(diff, qat ? 1e-10 : 2e-5) << recipe << ": max |trained(" << world_size()
                                        << " ranks x 2) - trained(1 rank x " << 2 * world_size() << ")|";
    // A different global batch must train something different.
    const LlmTrained other = tune(MPI_COMM_SELF, *llm_config(recipe, model, world_size(), dir.file("llm2.h5"), more));
    EXPECT_GT((flat(other.adapters) - flat(reference.adapters)).abs().max().item<double>(), 1e-4) << recipe;
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

INSTANTIATE_TEST_SUITE_P(Recipes, LlmTuning, ::testing::Values("lora", "qlora", "full", "qat", "qat-lora"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           std::erase(name, '-');
                           return name;
                         });

TEST(DpoTuning, RanksTimesBatchEqualsOneRankWithTheWholeBatch) {
  const std::string model = test::oracle_dir() + "/llama_tiny_2256";
  MGBENCH_REQUIRE_INPUTS(test::llm_inputs(model));
  SharedDir dir;
  // The mean over a micro-batch's pairs, averaged over ranks and micro-batches, is the mean over the
  // global batch: the same pairs per step (DistributedSampler), the same adapters.
  const LlmTrained distributed = tune(MPI_COMM_WORLD, *llm_config("dpo", model, 2, dir.file("dpo.h5")));
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  EXPECT_EQ(max_difference_across_ranks(comm, flat(distributed.adapters)), 0.0);
  if (world_rank() == 0) {
    const LlmTrained reference = tune(MPI_COMM_SELF, *llm_config("dpo", model, 2 * world_size(), dir.file("dpo1.h5")));
    const double diff = (flat(distributed.adapters) - flat(reference.adapters)).abs().max().item<double>();
    EXPECT_LT(diff, 2e-5) << "max |adapter(" << world_size() << " ranks x 2) - adapter(1 rank x " << 2 * world_size()
                          << ")|";
    const LlmTrained other = tune(MPI_COMM_SELF, *llm_config("dpo", model, world_size(), dir.file("dpo2.h5")));
    EXPECT_GT((flat(other.adapters) - flat(reference.adapters)).abs().max().item<double>(), 1e-5);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

std::int64_t allreduce_buckets(const train::TrainingLoop& loop) {
  for (const auto& [name, value] : loop.run_attributes()) {
    if (name == "allreduce_buckets") return std::get<std::int64_t>(value);
  }
  return -1;
}

TEST(TrainingLoop, EveryRecipeHonoursTheBucketSizes) {
  const std::string model = test::oracle_dir() + "/llama_tiny_2256";
  MGBENCH_REQUIRE_INPUTS(test::mnist_dir(), test::llm_inputs(model));
  SharedDir dir;
  runtime::MpiCommunicator comm(MPI_COMM_WORLD);
  auto buckets = [&](train::JobConfig& config, const std::string& mib) {
    config.set("bucket-mb", mib);
    config.set("first-bucket-mb", mib);
    config.validate();
    const train::TrainingLoop loop(config.train, *config.recipe, comm, {}, {});
    return allreduce_buckets(loop);
  };
  // DDP's defaults (1 MiB, then 25 MiB) put both models' gradients in one or two buckets; 16 KiB
  // buckets split them into many.
  const std::int64_t image_default = buckets(*small_config("ddp-ds", 8), "25");
  const std::int64_t image_small = buckets(*small_config("ddp-ds", 8), "0.015625");
  EXPECT_GE(image_default, 1);
  EXPECT_GT(image_small, image_default + 5);
  // The LLM recipes' default is FSDP (no buckets: reduce-scatters per unit); DDP's buckets with none.
  const Settings ddp{{"sharding", "none"}};
  const std::int64_t llm_default = buckets(*lora_config(model, 2, dir.file("b.h5"), ddp), "25");
  const std::int64_t llm_small = buckets(*lora_config(model, 2, dir.file("b.h5"), ddp), "0.00390625");
  // Under FSDP no buckets (gradients reduce-scattered per unit), and the bucket options are refused.
  auto fsdp = lora_config(model, 2, dir.file("b.h5"));
  fsdp->validate();
  EXPECT_EQ(allreduce_buckets(train::TrainingLoop(fsdp->train, *fsdp->recipe, comm, {}, {})), 0);
  EXPECT_THROW(buckets(*lora_config(model, 2, dir.file("b.h5")), "25"), ConfigError);
  EXPECT_EQ(llm_default, 1);
  EXPECT_GT(llm_small, 2);
}

/// An MPI communicator that says it chose `transports` (as NCCL's does from its log).
class TransportsSaying final : public runtime::Communicator {
 public:
  explicit TransportsSaying(std::string transports) : transports_(std::move(transports)) {}
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  std::string backend() const override { return "nccl"; }
  using Communicator::all_reduce;
  using Communicator::broadcast;
  std::unique_ptr<runtime::Work> all_reduce(const torch::Tensor& in, torch::Tensor& out,
                                            runtime::ReduceOp op) override {
    return inner_.all_reduce(in, out, op);
  }
  std::unique_ptr<runtime::Work> broadcast(const torch::Tensor& in, torch::Tensor& out, int root) override {
    return inner_.broadcast(in, out, root);
  }
  std::unique_ptr<runtime::Work> all_gather(const torch::Tensor& in, torch::Tensor& out) override {
    return inner_.all_gather(in, out);
  }
  std::unique_ptr<runtime::Work> reduce_scatter(const torch::Tensor& in, torch::Tensor& out,
                                                runtime::ReduceOp op) override {
    return inner_.reduce_scatter(in, out, op);
  }
  void barrier() override { inner_.barrier(); }
  std::string transports() const override { return transports_; }

 private:
  runtime::MpiCommunicator inner_{MPI_COMM_WORLD};
  std::string transports_;
};

TEST(GatherTransports, SumsTheRanksConnectionsAndPassesOnWhyTheyAreUnread) {
  const int r = world_rank(), n = world_size();
  // Rank r made r + 1 P2P connections; rank 0 also 2 over the network.
  TransportsSaying counted(fmt::format("P2P/CUMEM/read x{}{}", r + 1, r == 0 ? ", NET/IB/GDRDMA x2" : ""));
  EXPECT_EQ(runtime::gather_transports(counted, torch::kCPU, results::kTransportsBytes),
            fmt::format("P2P/CUMEM/read x{}, NET/IB/GDRDMA x2", n * (n + 1) / 2));
  TransportsSaying unread(r == n - 1 ? "unread: NCCL_DEBUG set outside mgbench" : "P2P/CUMEM/read x4");
  EXPECT_EQ(runtime::gather_transports(unread, torch::kCPU, results::kTransportsBytes),
            "unread: NCCL_DEBUG set outside mgbench");
  TransportsSaying none("none");
  EXPECT_EQ(runtime::gather_transports(none, torch::kCPU, results::kTransportsBytes), "none");
  // A list longer than the summary's field is cut at a whole entry.
  std::string many;
  for (int i = 0; i < 40; ++i) many += fmt::format("{}P2P/kind-{:02d} x1", i == 0 ? "" : ", ", i);
  TransportsSaying long_list(many);
  const std::string cut = runtime::gather_transports(long_list, torch::kCPU, results::kTransportsBytes);
  EXPECT_LT(cut.size(), results::kTransportsBytes);
  EXPECT_TRUE(cut.ends_with(", ...")) << cut;
  // The MPI backend chooses no transports.
  runtime::MpiCommunicator mpi(MPI_COMM_WORLD);
  EXPECT_EQ(runtime::gather_transports(mpi, torch::kCPU, results::kTransportsBytes), "");
}

}  // namespace
}  // namespace mgbench
