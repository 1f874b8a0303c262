// The GPU path's logic that runs without a GPU: rank placement, the backend table (choice, the
// GPU-sharing rule), the profile window, CUDA activity aggregation, the CPU phase clock, host upscaling.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/error.h"
#include "core/option_table.h"
#include "core/prefetcher.h"
#include "data/loader.h"
#include "data/transforms.h"
#include "profile/cuda_activity.h"
#include "profile/cupti_collector.h"
#include "profile/profile_window.h"
#include "runtime/backend.h"
#include "runtime/device.h"
#include "runtime/event_pool.h"
#include "runtime/nccl_communicator.h"
#include "test_support.h"
#include "train/cupti_window.h"
#include "train/device_pipeline.h"

namespace mgbench {
namespace {

using runtime::Backend;
using runtime::DeviceKind;
using runtime::DeviceRequest;

TEST(Placement, LocalRankPicksTheGpu) {
  EXPECT_EQ(runtime::place_rank(DeviceRequest::kAuto, 0, 3).kind, DeviceKind::kCpu);
  EXPECT_EQ(runtime::place_rank(DeviceRequest::kCpu, 4, 1).kind, DeviceKind::kCpu);
  const auto p = runtime::place_rank(DeviceRequest::kAuto, 4, 3);
  EXPECT_TRUE(p.is_cuda());
  EXPECT_EQ(p.index, 3);
  EXPECT_EQ(p.str(), "cuda:3");
  EXPECT_EQ(runtime::place_rank(DeviceRequest::kCuda, 1, 2).index, 0);  // srun --gpus-per-task=1: each rank sees one
  test::expect_error<ConfigError>([] { runtime::place_rank(DeviceRequest::kCuda, 0, 0); },
                                  {"--device cuda", "no CUDA device"});
  test::expect_error<ConfigError>([] { options::parse_choice(runtime::device_choices(), "device", "gpu"); },
                                  {"--device 'gpu': expected auto, cuda or cpu"});
}

/// The backend table of a build with every backend, or without `missing`: resolution reads `built`.
std::vector<runtime::BackendInfo> backends_built_without(std::optional<Backend> missing = std::nullopt) {
  std::vector<runtime::BackendInfo> rows(runtime::backend_choices().begin(), runtime::backend_choices().end());
  for (runtime::BackendInfo& r : rows) r.built = r.value == missing ? +[] { return false; } : +[] { return true; };
  return rows;
}

TEST(Placement, BackendFollowsTheDevice) {
  const runtime::DevicePlacement cpu;
  const runtime::DevicePlacement gpu{DeviceKind::kCuda, 0};
  const auto all = backends_built_without();
  EXPECT_EQ(runtime::resolve_backend(Backend::kAuto, cpu, all), Backend::kMpi);
  EXPECT_EQ(runtime::resolve_backend(Backend::kAuto, gpu, all), Backend::kNccl);
  EXPECT_EQ(runtime::resolve_backend(Backend::kAuto, gpu, backends_built_without(Backend::kNccl)), Backend::kMpi);
  EXPECT_EQ(runtime::resolve_backend(Backend::kMpi, gpu, all), Backend::kMpi);
  EXPECT_EQ(runtime::backend_name(Backend::kNccl), "nccl");
  test::expect_error<ConfigError>(
      [&] { runtime::resolve_backend(Backend::kNccl, cpu, all); },
      {"--backend nccl needs GPUs, but this rank runs on the CPU (--device); use --backend mpi"});
  test::expect_error<ConfigError>(
      [&] { runtime::resolve_backend(Backend::kNccl, gpu, backends_built_without(Backend::kNccl)); },
      {"--backend nccl: this mgbench was built without CUDA/NCCL"});
  test::expect_error<ConfigError>([&] { options::parse_choice(runtime::backend_choices(), "backend", "gloo"); },
                                  {"--backend 'gloo': expected auto, nccl or mpi"});
}

// Every row of the backend table: its name parses, it resolves where it can run and is refused,
// with the message, where it cannot (a CPU rank, a build without it), its GPU-sharing rule holds,
// and what `auto` takes on either device is a backend `mgbench comm` measures.
TEST(Placement, EveryBackendRowResolvesOrIsRefused) {
  const runtime::DevicePlacement cpu;
  const runtime::DevicePlacement gpu{DeviceKind::kCuda, 0};
  const auto all = backends_built_without();
  const std::vector<std::string> shared{"0000:1b:00.0", "0000:1b:00.0"};
  const std::string_view on_cpu = runtime::backend_name(runtime::resolve_backend(Backend::kAuto, cpu, all));
  for (const runtime::BackendInfo& b : runtime::backend_choices()) {
    SCOPED_TRACE(std::string(b.name));
    EXPECT_EQ(options::parse_choice(runtime::backend_choices(), "backend", b.name), b.value);
    EXPECT_EQ(runtime::backend_name(b.value), b.name);
    if (b.value == Backend::kAuto) {
      EXPECT_EQ(b.make, nullptr);
      continue;
    }
    ASSERT_TRUE(b.make != nullptr && b.built != nullptr && b.version != nullptr);
    EXPECT_FALSE(b.library.empty() || b.build_needs.empty());
    EXPECT_EQ(runtime::resolve_backend(b.value, gpu, all), b.value);
    if (b.needs_cuda) {
      test::expect_error<ConfigError>(
          [&] { runtime::resolve_backend(b.value, cpu, all); },
          {fmt::format("--backend {} needs GPUs, but this rank runs on the CPU (--device); use --backend {}", b.name,
                       on_cpu)});
    } else {
      EXPECT_EQ(runtime::resolve_backend(b.value, cpu, all), b.value);
    }
    test::expect_error<ConfigError>(
        [&] { runtime::resolve_backend(b.value, gpu, backends_built_without(b.value)); },
        {fmt::format("--backend {}: this mgbench was built without {}", b.name, b.build_needs)});
    if (b.shares_gpu) {
      EXPECT_EQ(runtime::check_gpu_sharing(shared, 0, b.value, "node7"), 2);
    } else {
      test::expect_error<ConfigError>([&] { runtime::check_gpu_sharing(shared, 0, b.value, "node7"); },
                                      {fmt::format("which {} does not allow", b.library)});
    }
  }
  for (const runtime::DevicePlacement& device : {cpu, gpu}) {
    EXPECT_TRUE(runtime::backend_info(runtime::resolve_backend(Backend::kAuto, device, all)).in_comm) << device.str();
  }
}

TEST(Placement, NcclRefusesTwoRanksOnOneGpu) {
  const std::vector<std::string> distinct{"0000:1b:00.0", "0000:3b:00.0"};
  EXPECT_EQ(runtime::check_gpu_sharing(distinct, 1, Backend::kNccl, "node1"), 1);
  const std::vector<std::string> shared{"0000:1b:00.0", "0000:1b:00.0", "0000:3b:00.0"};
  test::expect_error<ConfigError>([&] { runtime::check_gpu_sharing(shared, 0, Backend::kNccl, "node7"); },
                                  {"3 ranks on node node7", "2 GPU(s)", "local ranks 0, 1", "--backend mpi"});
  EXPECT_EQ(runtime::check_gpu_sharing(shared, 1, Backend::kMpi, "node7"), 2);
  EXPECT_EQ(runtime::check_gpu_sharing(shared, 2, Backend::kMpi, "node7"), 1);
}

// NVIDIA/nccl#1066: ranks confined to one GPU each cannot see NVLink between them.
TEST(Placement, RanksThatEachSeeOneGpuAreWarnedOf) {
  const std::string warning = runtime::single_device_warning({1, 1, 1, 1}, "gpu07");
  for (const char* part : {"each of the 4 ranks on gpu07 sees a single GPU", "NVIDIA/nccl#1066", "--gpus-per-node"}) {
    EXPECT_NE(warning.find(part), std::string::npos) << part << " in: " << warning;
  }
  EXPECT_EQ(runtime::single_device_warning({4, 4, 4, 4}, "gpu07"), "");  // each sees the node's GPUs
  EXPECT_EQ(runtime::single_device_warning({1}, "gpu07"), "");           // one rank on the node
  EXPECT_EQ(runtime::single_device_warning({1, 2}, "gpu07"), "");
}

TEST(ProfileWindow, ParsesSecondsStepsAndAll) {
  const auto paper = profile::parse_profile_window("0:720");
  EXPECT_FALSE(paper.by_steps);
  EXPECT_TRUE(paper.contains(0, 0));
  EXPECT_TRUE(paper.contains(719.9, 10));
  EXPECT_FALSE(paper.contains(720, 11));
  EXPECT_EQ(paper.describe(), "0:720 s");
  const auto steps = profile::parse_profile_window("steps:10:5");
  EXPECT_FALSE(steps.contains(0, 9));
  EXPECT_TRUE(steps.contains(1e6, 14));
  EXPECT_FALSE(steps.contains(0, 15));
  const auto all = profile::parse_profile_window("all");
  EXPECT_TRUE(all.contains(1e9, 1000000));
  EXPECT_EQ(all.describe(), "whole run");
  EXPECT_TRUE(profile::parse_profile_window("30:").contains(1e9, 0));  // to the end
  for (const char* bad : {"720", "a:b", "-1:5", "steps:1.5:2"}) {
    test::expect_error<ConfigError>([&] { profile::parse_profile_window(bad); }, {"--profile-window"});
  }
}

TEST(CudaActivity, NamesAreCleaned) {
  EXPECT_EQ(profile::clean_api_name("cudaLaunchKernel_v7000"), "cudaLaunchKernel");
  EXPECT_EQ(profile::clean_api_name("cuLaunchKernelEx"), "cuLaunchKernelEx");
  EXPECT_EQ(profile::clean_api_name("cudaStreamSynchronize_v3020"), "cudaStreamSynchronize");
  EXPECT_EQ(profile::clean_kernel_name("_Z3addPfS_"), "add");
  EXPECT_EQ(
      profile::clean_kernel_name("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE"),
      "ncclDevKernel_AllReduce_Sum_f32_RING_LL");
  EXPECT_EQ(profile::clean_kernel_name("void at::native::kern<(int)4, float>(int, float*)"),
            "at::native::kern<(int)4, float>");
  // A kernel in an unnamed namespace keeps its name (not cut at "(anonymous namespace)"'s parenthesis).
  EXPECT_EQ(profile::clean_kernel_name("_ZN2at6native12_GLOBAL__N_13fooIfEEvi"),
            "at::native::(anonymous namespace)::foo<float>");
  EXPECT_TRUE(profile::is_nccl_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL"));
  EXPECT_TRUE(profile::is_nccl_kernel("ncclKernel_AllReduce_RING_LL_Sum_float"));
  EXPECT_FALSE(profile::is_nccl_kernel("at::native::kern"));
}

TEST(OnBackward, BeginsOnTheBackwardsThreadAndEndsAfterEveryGradient) {
  // Item 8 of issue 32: the NVTX range of a backward opens where autograd runs it and closes when
  // autograd is done, whatever thread that is (on the CPU: the caller's).
  const torch::Tensor w = torch::ones({3}, torch::requires_grad());
  const torch::Tensor v = torch::ones({2}, torch::requires_grad());
  int begins = 0, ends = 0;
  bool grads_at_end = false;
  std::thread::id begin_thread;
  for (int step = 0; step < 2; ++step) {
    const torch::Tensor loss = (w * 2).sum() + (v * v).sum();
    train::on_backward(loss, [&] {
      ++begins;
      begin_thread = std::this_thread::get_id();
      EXPECT_FALSE(w.grad().defined() && step == 0);  // before any gradient
      return std::function<void()>([&] {
        ++ends;
        grads_at_end = w.grad().defined() && v.grad().defined();
      });
    });
    loss.backward();
  }
  EXPECT_EQ(begins, 2);
  EXPECT_EQ(ends, 2);
  EXPECT_TRUE(grads_at_end);
  EXPECT_EQ(begin_thread, std::this_thread::get_id());
  EXPECT_TRUE(torch::equal(w.grad(), torch::full({3}, 4.0)));  // the hooks change no gradient
  // A root without a gradient node takes no hook; mark_backward on the CPU is a no-op.
  train::on_backward(torch::ones({1}), [&] { return std::function<void()>(); });
  train::mark_backward((w * 3).sum());
}

TEST(CudaActivity, HtoDCopiesAreAttributedToWhatLabelledThemInEitherOrder) {
  using profile::CopyPurpose;
  using profile::MemcpyKind;
  profile::ActivityAggregator a;
  // A training batch: its label (on the runtime call 11) comes before the copy (driver id 12,
  // runtime id 11); an evaluation batch's copy before its label; staging labelled by its driver call.
  a.add_external_correlation(11, static_cast<std::uint64_t>(CopyPurpose::kTrainBatch));
  a.add_external_correlation(12, static_cast<std::uint64_t>(CopyPurpose::kTrainBatch));
  a.add_memcpy(MemcpyKind::kHtoD, 792 * 64, 0, 10, true, {12, 11});
  a.add_memcpy(MemcpyKind::kHtoD, 792 * 10, 0, 10, true, {22, 21});
  a.add_external_correlation(21, static_cast<std::uint64_t>(CopyPurpose::kEvalBatch));
  a.add_external_correlation(22, static_cast<std::uint64_t>(CopyPurpose::kEvalBatch));  // already matched
  a.add_external_correlation(32, static_cast<std::uint64_t>(CopyPurpose::kCollectiveStaging));
  a.add_memcpy(MemcpyKind::kHtoD, 4096, 0, 10, false, {32, 31});
  // Unlabelled: parameters moved once, a copy with no ids, a label of a call that copied nothing, a
  // label of an unknown purpose; a DtoH copy with a label counts with no HtoD.
  a.add_memcpy(MemcpyKind::kHtoD, 1000, 0, 10, false, {42, 41});
  a.add_memcpy(MemcpyKind::kHtoD, 7, 0, 10, false);
  a.add_external_correlation(51, static_cast<std::uint64_t>(CopyPurpose::kTrainBatch));
  a.add_external_correlation(61, 99);
  a.add_memcpy(MemcpyKind::kHtoD, 5, 0, 10, false, {62, 61});
  a.add_external_correlation(71, static_cast<std::uint64_t>(CopyPurpose::kTrainBatch));
  a.add_memcpy(MemcpyKind::kDtoH, 8, 0, 10, false, {72, 71});
  results::CudaSummaryRecord s;
  a.fill_summary(s);
  EXPECT_EQ(s.htod_count, 6);
  EXPECT_EQ(s.htod_bytes, 792 * 74 + 4096 + 1000 + 7 + 5);
  EXPECT_EQ(s.htod_train_count, 1);
  EXPECT_EQ(s.htod_train_bytes, 792 * 64);
  EXPECT_EQ(s.htod_eval_count, 1);
  EXPECT_EQ(s.htod_eval_bytes, 792 * 10);
  EXPECT_EQ(s.htod_staging_count, 1);
  EXPECT_EQ(s.htod_staging_bytes, 4096);
}

TEST(CudaActivity, PendingLabelsAndCopiesStayBounded) {
  using profile::CopyPurpose;
  profile::ActivityAggregator a;
  // A million labelled calls that copied nothing, then a copy whose label is recent: still matched.
  for (std::uint32_t id = 1; id <= 1'000'000; ++id) {
    a.add_external_correlation(id, static_cast<std::uint64_t>(CopyPurpose::kTrainBatch));
  }
  a.add_memcpy(profile::MemcpyKind::kHtoD, 100, 0, 1, false, {1'000'000, 0});
  a.add_memcpy(profile::MemcpyKind::kHtoD, 100, 0, 1, false, {1, 0});  // its label long dropped
  results::CudaSummaryRecord s;
  a.fill_summary(s);
  EXPECT_EQ(s.htod_train_count, 1);
  EXPECT_EQ(s.htod_count, 2);
}

TEST(CudaActivity, TotalsTablesAndNcclKernels) {
  profile::ActivityAggregator a;
  a.add_memcpy(profile::MemcpyKind::kHtoD, 784 * 64, 1000, 3000, true);
  a.add_memcpy(profile::MemcpyKind::kHtoD, 512, 5000, 5500, false);
  a.add_memcpy(profile::MemcpyKind::kDtoH, 8, 0, 100, true);
  a.add_api("cudaLaunchKernel_v7000", 0, 4000);
  a.add_api("cudaLaunchKernel_v7000", 0, 6000);
  a.add_api("cudaGetDevice_v3020", 0, 10);
  a.add_kernel("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE", 0, 500);
  for (int i = 0; i < 60; ++i) a.add_kernel("kernel_" + std::to_string(i), 0, 1000 + static_cast<std::uint64_t>(i));
  a.add_dropped(3);
  results::CudaSummaryRecord s;
  a.fill_summary(s);
  EXPECT_EQ(s.htod_count, 2);
  EXPECT_EQ(s.htod_bytes, 784 * 64 + 512);
  EXPECT_DOUBLE_EQ(s.htod_s, 2500e-9);
  EXPECT_EQ(s.htod_pinned_count, 1);
  EXPECT_EQ(s.dtoh_bytes, 8);
  EXPECT_EQ(s.kernel_count, 61);
  EXPECT_EQ(s.nccl_kernel_count, 1);
  EXPECT_DOUBLE_EQ(s.nccl_kernel_s, 500e-9);
  EXPECT_EQ(s.dropped_records, 3);

  const auto api = a.api_rows();
  ASSERT_GE(api.size(), std::size(profile::kReportedApis));
  EXPECT_STREQ(api[0].name, "cudaLaunchKernel");
  EXPECT_EQ(api[0].calls, 2);
  EXPECT_DOUBLE_EQ(api[0].time_s, 10000e-9);
  EXPECT_EQ(api[3].calls, 0);  // cudaStreamSynchronize: listed although never called
  EXPECT_STREQ(api[std::size(profile::kReportedApis)].name, "cudaGetDevice");
  // What report --cuda counts per step is always among the recorded rows (a zero is a zero, not absent).
  const std::set<std::string_view> reported(std::begin(profile::kReportedApis), std::end(profile::kReportedApis));
  for (const char* name : results::kLaunchApis) EXPECT_TRUE(reported.count(name)) << name;
  for (const char* name : results::kHostWaitApis) EXPECT_TRUE(reported.count(name)) << name;

  const auto kernels = a.kernel_rows();
  EXPECT_EQ(static_cast<std::int64_t>(kernels.size()), results::kCudaKernelRows);
  EXPECT_STREQ(kernels[0].name, "kernel_59");  // by time
  bool has_nccl = false;                       // the NCCL kernel is the shortest, yet kept
  for (const auto& k : kernels) has_nccl |= k.nccl != 0;
  EXPECT_TRUE(has_nccl);
}

TEST(CudaActivity, KernelBusyTimeIsTheUnionOfTheKernelsIntervals) {
  {  // overlapping (two streams), nested, touching, out of order, empty; a gap of 50 ns
    profile::ActivityAggregator a;
    a.add_kernel("k", 200, 300);
    a.add_kernel("k", 100, 150);
    a.add_kernel("k", 120, 140);  // inside the one before
    a.add_kernel("nccl", 250, 400);
    a.add_kernel("k", 400, 450);  // touches the end of the one before
    a.add_kernel("k", 500, 500);  // empty
    results::CudaSummaryRecord s;
    a.fill_summary(s);
    EXPECT_DOUBLE_EQ(s.kernel_busy_s, (50 + 250) * 1e-9);
    EXPECT_DOUBLE_EQ(s.kernel_s, (100 + 50 + 20 + 150 + 50) * 1e-9);  // each kernel counted
  }
  // Many kernels in CUPTI's order (per buffer, streams interleaved), so the list is merged while it
  // grows: against a bitmap of the nanoseconds covered.
  std::mt19937_64 rng(47);
  constexpr std::uint64_t kSpan = 2'000'000;
  std::vector<char> covered(kSpan, 0);
  profile::ActivityAggregator a;
  for (int k = 0; k < 60'000; ++k) {
    const std::uint64_t start = rng() % (kSpan - 200);
    const std::uint64_t end = start + rng() % 60;
    std::fill(covered.begin() + static_cast<std::ptrdiff_t>(start), covered.begin() + static_cast<std::ptrdiff_t>(end),
              1);
    a.add_kernel("k", start, end);
  }
  results::CudaSummaryRecord s;
  a.fill_summary(s);
  const auto busy = static_cast<double>(std::count(covered.begin(), covered.end(), 1));
  EXPECT_DOUBLE_EQ(s.kernel_busy_s, busy * 1e-9);
  EXPECT_LT(s.kernel_busy_s, s.kernel_s);  // not vacuous: the kernels overlap
  EXPECT_GT(s.kernel_busy_s, 0.5 * s.kernel_s);
}

// The window's gaps between training steps (an evaluation, a checkpoint, the run's end): what starts
// in one -- by its start, delivered before or after the gap closed -- is kept out of the steps'
// totals and rows, counted apart; the copies' purposes count every copy.
TEST(CudaActivity, WhatStartsBetweenStepsIsKeptApart) {
  profile::ActivityAggregator a;
  const auto step = [&](std::uint64_t t) {  // one step's work starting at t
    a.add_api("cudaLaunchKernel_v7000", t, t + 10);
    a.add_kernel("gemm", t + 20, t + 120);
    a.add_memcpy(profile::MemcpyKind::kHtoD, 100, t + 5, t + 15, true, {static_cast<std::uint32_t>(t + 1), 0});
  };
  step(1000);
  a.begin_between_steps(2000);
  // The evaluation: an eval-labelled copy (its label first), its launches and kernels.
  a.add_external_correlation(7, static_cast<std::uint64_t>(profile::CopyPurpose::kEvalBatch));
  a.add_memcpy(profile::MemcpyKind::kHtoD, 4000, 2100, 2200, true, {7, 0});
  for (std::uint64_t t = 2300; t < 2800; t += 100) {
    a.add_api("cudaLaunchKernel_v7000", t, t + 10);
    a.add_kernel("conv", t + 20, t + 90);
  }
  a.add_api("cudaStreamSynchronize_v3020", 2900, 2990);
  a.add_kernel("gemm", 1500, 1600);  // a step's kernel delivered while the gap is open
  a.end_between_steps(3000);
  step(3000);                        // the next step starts where the gap ends
  a.add_kernel("late", 2500, 2600);  // a gap's kernel delivered after the gap closed
  a.begin_between_steps(4000);       // the run's end: a gap still open (CuptiWindow::close ends it)
  a.add_api("cudaFree_v3020", 4100, 4200);

  results::CudaSummaryRecord s;
  a.fill_summary(s);
  EXPECT_DOUBLE_EQ(s.between_steps_s, 1000e-9);     // the closed gap only
  EXPECT_EQ(s.between_steps_api_calls, 5 + 1 + 1);  // the launches, the sync, cudaFree
  EXPECT_EQ(s.between_steps_kernel_count, 5 + 1);   // conv, late
  EXPECT_DOUBLE_EQ(s.between_steps_kernel_s, (5 * 70 + 100) * 1e-9);
  EXPECT_EQ(s.between_steps_copy_count, 1);  // the evaluation's
  EXPECT_EQ(s.between_steps_copy_bytes, 4000);
  // The steps': two of them, and the late gemm.
  EXPECT_EQ(s.kernel_count, 3);
  EXPECT_DOUBLE_EQ(s.kernel_busy_s, 300e-9);
  EXPECT_EQ(s.htod_count, 2);
  EXPECT_EQ(s.htod_bytes, 200);
  EXPECT_EQ(s.htod_pinned_count, 2);
  EXPECT_EQ(s.htod_eval_count, 1);  // by purpose: in a gap too
  EXPECT_EQ(s.htod_eval_bytes, 4000);
  const auto api = a.api_rows();
  EXPECT_STREQ(api[0].name, "cudaLaunchKernel");
  EXPECT_EQ(api[0].calls, 2);
  EXPECT_EQ(api[3].calls, 0);  // cudaStreamSynchronize: the evaluation's only
  const auto kernels = a.kernel_rows();
  ASSERT_EQ(kernels.size(), 1U);
  EXPECT_STREQ(kernels[0].name, "gemm");
  EXPECT_EQ(kernels[0].count, 3);
  // A second begin inside an open gap and an end without one change nothing.
  profile::ActivityAggregator b;
  b.end_between_steps(10);
  b.begin_between_steps(100);
  b.begin_between_steps(150);
  b.end_between_steps(300);
  b.end_between_steps(400);
  b.add_kernel("k", 120, 130);
  b.add_kernel("k", 350, 360);
  b.fill_summary(s);
  EXPECT_DOUBLE_EQ(s.between_steps_s, 200e-9);
  EXPECT_EQ(s.between_steps_kernel_count, 1);
  EXPECT_EQ(s.kernel_count, 1);
}
/// A stand-in CUPTI collector: the calls a CuptiWindow makes, in order.
class RecordingCollector final : public profile::CuptiCollector {
 public:
  explicit RecordingCollector(std::vector<std::string>& calls) : calls_(calls) {}
  void start() override {
    calls_.emplace_back("start");
    running_ = true;
  }
  void stop() override {
    calls_.emplace_back("stop");
    running_ = false;
  }
  bool running() const override { return running_; }
  const profile::ActivityAggregator& totals() override { return totals_; }
  void begin_between_steps() override { calls_.emplace_back("begin"); }
  void end_between_steps() override { calls_.emplace_back("end"); }

 private:
  std::vector<std::string>& calls_;
  profile::ActivityAggregator totals_;
  bool running_ = false;
};

// The loop's window over steps 1 and 2 of four: a gap begins after each step inside it and ends as
// the next step starts, before the window closes there; a window open at the run's end closes its
// last gap (the evaluation, the export after the last step) with it.
TEST(CuptiWindow, EachGapBetweenStepsEndsAtTheNextStepOrTheClose) {
  const torch::Device cpu(torch::kCPU);
  const auto calls_of = [&](const char* window) {
    std::vector<std::string> calls;
    train::CuptiWindow w;
    w.set(std::make_unique<RecordingCollector>(calls), profile::parse_profile_window(window));
    for (std::int64_t step = 0; step < 4; ++step) {
      w.update(static_cast<double>(step), step, cpu);
      w.step_ended();
    }
    w.close(cpu);
    return calls;
  };
  using Calls = std::vector<std::string>;
  EXPECT_EQ(calls_of("steps:1:2"), (Calls{"start", "begin", "end", "begin", "end", "stop"}));
  EXPECT_EQ(calls_of("all"), (Calls{"start", "begin", "end", "begin", "end", "begin", "end", "begin", "end", "stop"}));
}

TEST(CudaActivity, AnExternalProfilerIsRecognised) {
  // The test's own environment may be under a tool: keep and restore it.
  const auto saved = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v != nullptr ? std::optional<std::string>(v) : std::nullopt;
  };
  const auto nsys = saved("NSYS_PROFILING_SESSION_ID");
  const auto injection = saved("CUDA_INJECTION64_PATH");
  unsetenv("NSYS_PROFILING_SESSION_ID");
  unsetenv("CUDA_INJECTION64_PATH");
  EXPECT_EQ(profile::external_cuda_profiler(), "");
  setenv("CUDA_INJECTION64_PATH", "/opt/nsight/libToolsInjection64.so", 1);
  EXPECT_NE(profile::external_cuda_profiler().find("libToolsInjection64.so"), std::string::npos);
  setenv("NSYS_PROFILING_SESSION_ID", "7", 1);
  EXPECT_NE(profile::external_cuda_profiler().find("Nsight Systems"), std::string::npos);
  unsetenv("NSYS_PROFILING_SESSION_ID");
  unsetenv("CUDA_INJECTION64_PATH");
  if (nsys) setenv("NSYS_PROFILING_SESSION_ID", nsys->c_str(), 1);
  if (injection) setenv("CUDA_INJECTION64_PATH", injection->c_str(), 1);
}

TEST(Nccl, TheLoadedLibraryMustBeTheOneBuiltAgainst) {
  EXPECT_EQ(runtime::check_nccl_version(22809, 22809), "");
  EXPECT_NE(runtime::check_nccl_version(22807, 22809).find("2.28.7 loaded, built against 2.28.9"), std::string::npos);
  test::expect_error<CommError>([] { runtime::check_nccl_version(22105, 22809); },
                                {"NCCL 2.21.5 is loaded", "built against NCCL 2.28.9", "LD_LIBRARY_PATH"});
}

TEST(PhaseClock, CpuLapsAddUpToTheWallTime) {
  // Each phase's time lies between the host clock's readings just inside and just outside its
  // enter() calls (however long the sleeps really took: the machine may be busy).
  train::PhaseClock clock(torch::kCPU);
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> at;  // before and after each call
  const auto call = [&](const auto& f) {
    at.push_back(Clock::now());
    f();
    at.push_back(Clock::now());
  };
  const auto seconds = [&](std::size_t from, std::size_t to) {
    return std::chrono::duration<double>(at[to] - at[from]).count();
  };
  call([&] { clock.enter(results::Phase::kData); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  call([&] { clock.enter(results::Phase::kForward); });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  call([&] { clock.enter(results::Phase::kData); });  // a phase entered twice accumulates
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  results::PhaseTimes t;
  call([&] { t = clock.take(); });
  EXPECT_GE(t.data_s, seconds(1, 2) + seconds(5, 6));
  EXPECT_LE(t.data_s, seconds(0, 3) + seconds(4, 7));
  EXPECT_GE(t.forward_s, seconds(3, 4));
  EXPECT_LE(t.forward_s, seconds(2, 5));
  EXPECT_GE(t.data_s, 0.025);  // the sleeps' least
  EXPECT_GE(t.forward_s, 0.010);
  EXPECT_EQ(t.backward_s, 0.0);
  EXPECT_EQ(clock.take().data_s, 0.0);  // take() resets
}

TEST(Prefetcher, HandsOverInOrderAtMostCapacityAheadAndRethrowsInTheFailingItemsTurn) {
  std::mutex mutex;
  int made = 0;  // items produce() has returned
  std::set<std::thread::id> producers;
  const auto counting = [&](int last, bool fail) {
    return [&, last, fail]() -> std::optional<std::unique_ptr<int>> {  // move-only items
      const std::lock_guard lock(mutex);
      producers.insert(std::this_thread::get_id());
      if (made == last) {
        if (fail) throw DataError("item " + std::to_string(last) + " is broken");
        return std::nullopt;
      }
      return std::make_unique<int>(made++);
    };
  };
  {
    Prefetcher<std::unique_ptr<int>> items(counting(5, false), 2);
    // Nothing taken: the producer stops at `capacity` items and waits for room.
    const auto made_now = [&] {
      const std::lock_guard lock(mutex);
      return made;
    };
    for (int waited_ms = 0; made_now() < 2 && waited_ms < 5000; waited_ms += 10) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(made_now(), 2);
    for (int expected = 0; expected < 5; ++expected) {
      const auto item = items.next();
      ASSERT_TRUE(item);
      EXPECT_EQ(**item, expected);
    }
    EXPECT_FALSE(items.next());
    EXPECT_FALSE(items.next());
  }
  EXPECT_EQ(producers.size(), 1u);
  EXPECT_EQ(producers.count(std::this_thread::get_id()), 0u);

  made = 0;
  Prefetcher<std::unique_ptr<int>> failing(counting(2, true), 4);
  EXPECT_EQ(**failing.next(), 0);  // the items made before the failure first
  EXPECT_EQ(**failing.next(), 1);
  test::expect_error<DataError>([&] { failing.next(); }, {"item 2 is broken"});
  test::expect_error<DataError>([&] { failing.next(); }, {"item 2 is broken"});  // and every call after

  // Destroyed with its producer waiting for room and the consumer gone: stops and joins, no hang.
  made = 0;
  { Prefetcher<std::unique_ptr<int>> abandoned(counting(1000, false), 1); }
  EXPECT_LE(made, 1);
}

TEST(BatchLoader, AssemblesInPlanOrderOnItsThreadAndRethrowsItsErrors) {
  data::MnistSplit split;
  split.rows = 28;
  split.cols = 28;
  split.images.resize(4 * 784);
  for (std::size_t i = 0; i < split.images.size(); ++i) split.images[i] = static_cast<std::uint8_t>(i * 7 % 256);
  split.labels = {1, 2, 3, 4};
  std::vector<data::PlannedBatch> plan(3);
  plan[0].indices = {3, 2};
  plan[1].indices = {0};
  plan[2].indices = {1, 0, 2};
  plan[2].compute = false;
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::thread::id> threads;
  data::BatchLoader loader(
      plan,
      [&](const data::PlannedBatch& p, bool pin) {
        threads.push_back(std::this_thread::get_id());
        return data::assemble_mnist_batch(split, p.indices, pin);
      },
      /*prefetch=*/2, /*pin_memory=*/false);
  for (const auto& expected : plan) {
    const auto batch = loader.next();
    ASSERT_TRUE(batch);
    EXPECT_EQ(batch->plan.indices, expected.indices);
    EXPECT_EQ(batch->plan.compute, expected.compute);
    ASSERT_EQ(batch->tensors.size(), 2u);
    EXPECT_EQ(batch->samples, static_cast<std::int64_t>(expected.indices.size()));
    for (std::size_t k = 0; k < expected.indices.size(); ++k) {
      const auto i = static_cast<std::size_t>(expected.indices[k]);
      EXPECT_EQ(batch->tensors[1][static_cast<std::int64_t>(k)].item<std::int64_t>(), split.labels[i]);
      EXPECT_EQ(batch->tensors[0][static_cast<std::int64_t>(k)][0][0][5].item<std::uint8_t>(),
                split.images[i * 784 + 5]);
    }
  }
  EXPECT_FALSE(loader.next());
  ASSERT_EQ(threads.size(), 3u);
  for (const auto& id : threads) EXPECT_NE(id, caller);

  data::BatchLoader failing(
      plan, [](const data::PlannedBatch&, bool) -> data::Batch { throw DataError("row 7 of data.json is broken"); }, 2,
      false);
  test::expect_error<DataError>([&] { failing.next(); }, {"row 7 of data.json"});
}

TEST(DeviceFeeder, OnTheCpuTheBatchIsUsedInPlaceAndNoCopyIsTimed) {
  data::MnistSplit split;
  split.rows = 28;
  split.cols = 28;
  split.images.assign(2 * 784, 9);
  split.labels = {1, 2};
  std::vector<data::PlannedBatch> plan(1);
  plan[0].indices = {0, 1};
  data::BatchLoader loader(
      plan, [&](const data::PlannedBatch& p, bool pin) { return data::assemble_mnist_batch(split, p.indices, pin); }, 1,
      false);
  train::DeviceFeeder feeder(loader, torch::kCPU, /*async=*/false, /*depth=*/2);
  train::PhaseClock clock(torch::kCPU);
  const auto batch = feeder.next(clock);
  ASSERT_TRUE(batch);
  EXPECT_TRUE(batch->tensors[0].is_cpu());
  const results::PhaseTimes t = clock.take();
  EXPECT_GT(t.data_s, 0.0);
  EXPECT_EQ(t.h2d_s, 0.0);  // nothing crosses a bus on the CPU: the schema's h2d_s is exactly 0
  EXPECT_FALSE(feeder.next(clock));
}

TEST(DeviceFeeder, PreparesTheBatchesThisRankComputesOnAndTimesItAsTransform) {
  data::MnistSplit split;
  split.rows = 28;
  split.cols = 28;
  split.images.assign(3 * 784, 9);
  split.labels = {1, 2, 3};
  std::vector<data::PlannedBatch> plan(3);
  for (std::int64_t i = 0; i < 3; ++i) plan[static_cast<std::size_t>(i)].indices = {i};
  plan[1].compute = false;  // ddp-rr: another rank computes it; nothing to prepare
  data::BatchLoader loader(
      plan, [&](const data::PlannedBatch& p, bool pin) { return data::assemble_mnist_batch(split, p.indices, pin); }, 1,
      false);
  std::vector<std::int64_t> prepared;
  train::DeviceFeeder feeder(loader, torch::kCPU, /*async=*/false, /*depth=*/2, [&](data::Batch b) {
    prepared.push_back(b.plan.indices.front());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    b.tensors.push_back(torch::full({1}, 7));
    return b;
  });
  train::PhaseClock clock(torch::kCPU);
  std::vector<std::size_t> tensors;
  while (const auto batch = feeder.next(clock)) tensors.push_back(batch->tensors.size());
  EXPECT_EQ(prepared, (std::vector<std::int64_t>{0, 2}));
  EXPECT_EQ(tensors, (std::vector<std::size_t>{3, 2, 3}));  // images, labels (+ what prepare added)
  const results::PhaseTimes t = clock.take();
  EXPECT_GE(t.transform_s, 0.1);  // prepare's time is the transform phase's, not the loader's
  EXPECT_LT(t.data_s, 0.1);
}

/// Stands in for a CUDA event: counts the live ones.
struct FakeEvent {
  static inline int live = 0;
  FakeEvent() { ++live; }
  ~FakeEvent() { --live; }
  FakeEvent(const FakeEvent&) = delete;
  FakeEvent& operator=(const FakeEvent&) = delete;
};

runtime::EventPool<FakeEvent> fake_pool() {
  return runtime::EventPool<FakeEvent>([] { return std::make_unique<FakeEvent>(); });
}

TEST(EventPool, AThousandCollectivesCreateOnlyTheEventsInFlightAtOnce) {
  auto pool = fake_pool();
  // The NCCL backend's pattern: a ready event released at once, start and done held by the
  // collective's Work; at most two collectives in flight (bucket k waited on while k+1 runs).
  std::vector<std::shared_ptr<FakeEvent>> previous;
  for (int collective = 0; collective < 1000; ++collective) {
    { const auto ready = pool.acquire(); }
    std::vector<std::shared_ptr<FakeEvent>> held = {pool.acquire(), pool.acquire()};
    previous = std::move(held);  // the collective before this one completes
  }
  EXPECT_EQ(pool.created(), 4u);  // two collectives x {start, done}; the ready event reuses one
  EXPECT_EQ(FakeEvent::live, 4);
  previous.clear();
  EXPECT_EQ(pool.idle(), 4u);
}

TEST(EventPool, EventsInUseAreNeverHandedOutTwice) {
  auto pool = fake_pool();
  std::vector<std::shared_ptr<FakeEvent>> held;
  std::set<FakeEvent*> distinct;
  for (int i = 0; i < 8; ++i) {
    held.push_back(pool.acquire());
    distinct.insert(held.back().get());
  }
  EXPECT_EQ(distinct.size(), 8u);
  const std::set<FakeEvent*> first(distinct);
  held.clear();
  EXPECT_EQ(pool.idle(), 8u);
  for (int i = 0; i < 8; ++i) held.push_back(pool.acquire());
  EXPECT_EQ(pool.created(), 8u);
  for (const auto& e : held) EXPECT_TRUE(first.count(e.get()) == 1) << "a recycled event was expected";
}

TEST(EventPool, AnEventReleasedOnAnotherThreadReturnsToThePool) {
  auto pool = fake_pool();
  auto event = pool.acquire();
  std::thread watchdog([e = std::move(event)]() mutable { e.reset(); });  // as the watchdog drops a done collective
  watchdog.join();
  EXPECT_EQ(pool.idle(), 1u);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool] {
      for (int i = 0; i < 2000; ++i) {
        const auto a = pool.acquire();
        const auto b = pool.acquire();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(pool.created(), 8u);
  EXPECT_EQ(pool.idle(), pool.created());
}

TEST(EventPool, AnEventThatOutlivesItsPoolIsDestroyedAndAFailedFactoryCountsNothing) {
  const int before = FakeEvent::live;
  std::shared_ptr<FakeEvent> survivor;
  {
    auto pool = fake_pool();
    survivor = pool.acquire();
    { const auto idle = pool.acquire(); }
  }
  EXPECT_EQ(FakeEvent::live, before + 1);  // the pool's idle event went with it
  survivor.reset();
  EXPECT_EQ(FakeEvent::live, before);

  runtime::EventPool<FakeEvent> failing(
      []() -> std::unique_ptr<FakeEvent> { throw std::runtime_error("cudaEventCreateWithFlags: out of memory"); });
  EXPECT_THROW(failing.acquire(), std::runtime_error);
  EXPECT_EQ(failing.created(), 0u);
}

}  // namespace
}  // namespace mgbench
