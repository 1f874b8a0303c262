#include "train/run_summary.h"

#include <algorithm>
#include <ctime>
#include <tuple>

#include "core/host_memory.h"
#include "core/log.h"
#include "core/timer.h"
#include "profile/cupti_collector.h"
#include "runtime/communicator.h"
#include "train/device_pipeline.h"
#include "train/loop.h"

namespace mgbench::train {

runtime::PeakFlops run_peak_flops(const RunSetup& setup) {
  const axes::PrecisionInfo& precision = setup.precision;
  const axes::Dtype dtype = precision.autocast ? precision.autocast_dtype : precision.param_dtype;
  const runtime::MathKind kind = dtype == axes::Dtype::kBFloat16  ? runtime::MathKind::kBf16
                                 : dtype == axes::Dtype::kFloat16 ? runtime::MathKind::kFp16
                                 : dtype == axes::Dtype::kFloat64 ? runtime::MathKind::kFp64
                                 : precision.tf32                 ? runtime::MathKind::kTf32
                                                                  : runtime::MathKind::kFp32;
  const runtime::CudaDeviceModel model =
      setup.placement.is_cuda() ? runtime::cuda_device_model(setup.placement.index) : runtime::CudaDeviceModel{};
  return runtime::peak_flops(model.name, model.sm_count, kind, setup.options.peak_tflops);
}

std::int64_t peak_memory_bytes(const torch::Device& device) {
  if (device.is_cuda()) return device_memory_peaks(device).first;
  return host_memory::peak_resident_bytes();
}

namespace {

/// The CUDA metrics of the profile window into this rank's tables (GPU runs with CUPTI).
void write_cuda_metrics(LoopState& state, const RunSinks& sinks) {
  profile::CuptiCollector* cupti = state.cupti.collector();
  if (cupti == nullptr) return;
  const torch::Device& device = state.setup.device;
  state.cupti.close(device);
  results::CudaSummaryRecord cuda;
  const auto& totals = cupti->totals();
  totals.fill_summary(cuda);
  cuda.window_start_s = state.cupti.opened_s();
  cuda.window_s = state.cupti.open_s() - cuda.between_steps_s;  // the steps' time
  cuda.samples = state.cupti.samples();
  cuda.steps = state.cupti.steps();
  std::tie(cuda.peak_allocated_bytes, cuda.peak_reserved_bytes) = device_memory_peaks(device);
  sinks.writer.write_cuda_metrics(cuda, totals.api_rows(), totals.kernel_rows());
}

/// The rates of all ranks into summary: samples and tokens computed and FLOPs, summed over the
/// ranks, over rank 0's training time (train_s); the mean final loss over ranks; with
/// --warmup-steps-excluded K, what came after each rank's K-th step (NaN rates when no step came
/// after it). One all-reduce.
void summarise_all_ranks(const LoopState& state, results::RunSummary& summary) {
  const RunSetup& setup = state.setup;
  const RunProgress& run = state.progress;
  const std::int64_t warmup_steps = setup.options.warmup_steps_excluded;
  const RunProgress::Warmup& w = run.warmup;
  torch::Tensor totals = torch::tensor({static_cast<double>(run.computed_samples - w.samples), summary.final_loss,
                                        static_cast<double>(run.real_tokens - w.real_tokens), run.flops - w.flops,
                                        static_cast<double>(run.padded_tokens - w.padded_tokens), w.taken ? 1.0 : 0.0},
                                       torch::kFloat64)
                             .to(setup.device);
  setup.comm.all_reduce(totals, runtime::ReduceOp::kSum)->wait();
  totals = totals.cpu();
  const double world = static_cast<double>(setup.world_size());
  summary.final_loss = totals[1].item<double>() / world;
  // The time and steps the rates are over: rank 0's training time, as train_s, less its warm-up.
  double span_s = summary.train_s - w.train_s;
  const std::int64_t span_steps = run.global_step - run.first_step - warmup_steps;
  // No step after the warm-up -- fewer steps than K, or exactly K (the warm-up taken as the last one
  // ended): no rates, rather than the few microseconds before the run's end.
  if (warmup_steps > 0 && (totals[5].item<double>() < world || span_steps <= 0)) {
    log::warn("--warmup-steps-excluded {}: the run has {} optimizer step(s): no throughput after the warm-up",
              warmup_steps, run.global_step - run.first_step);
    span_s = results::kNaN;
  }
  summary.samples_per_s = totals[0].item<double>() / span_s;
  summary.s_per_it = span_s / static_cast<double>(std::max<std::int64_t>(span_steps, 1));
  summary.tokens_per_s = totals[2].item<double>() > 0 ? totals[2].item<double>() / span_s : results::kNaN;
  summary.padded_tokens_per_s = totals[4].item<double>() > 0 ? totals[4].item<double>() / span_s : results::kNaN;
  summary.mfu = totals[3].item<double>() / (span_s * world * run_peak_flops(setup).flops);
}

/// What every summary ends with: the peak memory, the time, the ranks' transports; rank 0 writes it.
void complete_summary(const RunSetup& setup, results::RunSummary& summary, results::ResultsWriter& writer) {
  summary.peak_memory_bytes = peak_memory_bytes(setup.device);
  summary.finished_unix_s = static_cast<double>(std::time(nullptr));
  summary.set_transports(runtime::gather_transports(setup.comm, setup.device, results::kTransportsBytes));
  if (setup.rank() == 0) writer.write_summary(summary);
}

}  // namespace

results::RunSummary finish_run(LoopState& state, const TrainingLoop& loop, const RunSinks& sinks) {
  RunProgress& run = state.progress;
  results::RunSummary& summary = run.summary;
  summary.total_s = sinks.run_time(now_s(), run);
  write_cuda_metrics(state, sinks);
  state.energy.write(run, sinks.writer);
  summarise_all_ranks(state, summary);
  complete_summary(state.setup, summary, sinks.writer);
  run.elapsed_s = summary.total_s;
  save_checkpoint(sinks.control, run, /*completed=*/true,
                  {sinks.writer, [&loop](CheckpointState& checkpoint) { loop.state_dict(checkpoint); }});
  return summary;
}

results::RunSummary evaluation_summary(const LoopState& state, const EvalResult& result, double eval_s,
                                       results::ResultsWriter& writer) {
  results::RunSummary summary;
  summary.eval_s = eval_s;
  summary.total_s = eval_s;
  summary.train_s = 0;
  summary.eval_loss = result.loss;
  summary.test_accuracy = result.accuracy;
  summary.final_loss = result.loss;
  complete_summary(state.setup, summary, writer);
  return summary;
}

}  // namespace mgbench::train
