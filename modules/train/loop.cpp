#include "train/loop.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <optional>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "profile/cupti_collector.h"
#include "profile/nvtx.h"
#include "profile/profile_window.h"
#include "runtime/grad_sync.h"
#include "runtime/peak_flops.h"
#include "train/device_pipeline.h"
#include "train/grad_scaler.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"

namespace mgbench::train {
namespace {

/// The peak FLOP/s for MFU of this run's device and arithmetic (runtime/peak_flops.h).
runtime::PeakFlops run_peak_flops(const runtime::DevicePlacement& p, const PrecisionInfo& precision,
                                  double configured_tflops) {
  const torch::ScalarType dtype = precision.autocast ? precision.autocast_dtype : precision.param_dtype;
  const runtime::MathKind kind = dtype == torch::kBFloat16 ? runtime::MathKind::kBf16
                                 : dtype == torch::kHalf   ? runtime::MathKind::kFp16
                                 : dtype == torch::kDouble ? runtime::MathKind::kFp64
                                 : precision.tf32          ? runtime::MathKind::kTf32
                                                           : runtime::MathKind::kFp32;
  const runtime::CudaDeviceModel model = p.is_cuda() ? runtime::cuda_device_model(p.index) : runtime::CudaDeviceModel{};
  return runtime::peak_flops(model.name, model.sm_count, kind, configured_tflops);
}

/// Peak memory of this process on its device: the CUDA caching allocator's peak allocation, or the
/// peak resident set size on the CPU (getrusage), in bytes.
std::int64_t peak_memory_bytes(const torch::Device& device) {
  if (device.is_cuda()) return device_memory_peaks(device).first;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux: kilobytes
}

/// The epoch's plan cut after its last optimizer step's last micro-batch: steps_per_epoch steps
/// of grad_accum computed batches each (a --max-steps limit, or computed batches short of a
/// whole step, leave a tail that is not loaded). Without a cut, loads after the last computed
/// batch stay (ddp-rr: another rank computes them).
std::vector<data::PlannedBatch> cut_plan(std::vector<data::PlannedBatch> plan, std::int64_t micro_batches) {
  std::int64_t computed = 0;
  for (std::size_t k = 0; k < plan.size(); ++k) {
    computed += plan[k].compute ? 1 : 0;
    if (computed == micro_batches) {
      bool more = false;
      for (std::size_t j = k + 1; j < plan.size() && !more; ++j) more = plan[j].compute;
      if (more) plan.resize(k + 1);
      break;
    }
  }
  return plan;
}

}  // namespace

struct TrainingLoop::State {
  TrainOptions train;
  Recipe& recipe;
  runtime::Communicator& comm;
  runtime::DevicePlacement placement;
  torch::Device device = torch::kCPU;
  const PrecisionInfo& precision;
  int threads = 1;
  profile::ProfileWindow window;
  std::unique_ptr<profile::CuptiCollector> cupti;
  std::unique_ptr<GradScaler> scaler;
  std::vector<torch::Tensor> trainable;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  runtime::GradSyncOptions sync_options;
  std::unique_ptr<runtime::GradSync> grad_sync;
  std::vector<torch::Tensor> shared_buffers;  // DDP's broadcast_buffers, before each forward and evaluation
  data::EpochPlanOptions plan_options;
  std::int64_t steps_per_epoch = 0;

  State(const TrainOptions& t, Recipe& r, runtime::Communicator& c, runtime::DevicePlacement p)
      : train(t), recipe(r), comm(c), placement(p), precision(precision_info(t.precision)) {}

  bool distributed() const { return comm.world_size() > 1; }
  bool share_buffers() const { return distributed() && !shared_buffers.empty(); }
};

TrainingLoop::TrainingLoop(const TrainOptions& train, Recipe& recipe, runtime::Communicator& comm,
                           runtime::DevicePlacement placement, int local_size)
    : state_(std::make_unique<State>(train, recipe, comm, placement)) {
  auto& s = *state_;
  const auto& t = s.train;
  const data::StrategyInfo& strategy = data::strategy_info(t.strategy);
  MGBENCH_REQUIRE(!strategy.single_process || comm.world_size() == 1, ConfigError,
                  "--strategy {} is single-process (one rank drives the GPUs): start 1 rank, not {}", strategy.name,
                  comm.world_size());
  // Threads: as asked, else the node's cores shared by its ranks -- but never more than this rank
  // may run on (its affinity: a launcher that binds it to one core makes more threads share it).
  const int bound = runtime::available_cores();
  const int share = std::max(1, runtime::machine_cores() / std::max(1, local_size));
  s.threads = t.threads > 0 ? t.threads : std::min(share, bound);
  if (t.threads > bound) {
    log::warn(
        "--threads {}: this rank may run on {} core(s) only (its CPU affinity, set by the launcher: Open MPI "
        "binds each rank to one core when np <= 2; --bind-to none, or --map-by slot:PE={} gives it more)",
        t.threads, bound, t.threads);
  } else if (t.threads == 0 && bound < share) {
    log::info("threads: {} per rank, the cores its CPU affinity allows ({} would be this node's share)", s.threads,
              share);
  }
  s.device = to_torch_device(placement);
  s.window = profile::parse_profile_window(t.profile_window);
  profile::set_nvtx_enabled(t.nvtx);
  if (t.pin_memory && !s.device.is_cuda()) {
    log::warn("--pin-memory true has no effect on the CPU (page-locked memory is for GPU copies)");
  }
  configure_device(s.device, t.cudnn_benchmark);
  apply_math_mode(s.precision);
  torch::set_num_threads(s.threads);
  // Before the recipe builds the model: from here on, every step reuses the memory the last freed.
  if (t.malloc_reuse) {
    const std::string line = host_memory::keep_freed_memory_for_reuse();
    if (comm.rank() == 0) log::info("{}", line);
  }
  torch::manual_seed(t.seed);
  recipe.setup({s.train, s.device, placement, s.precision, comm.rank(), comm.world_size()});

  s.trainable = recipe.trainable_parameters();
  s.optimizer = make_optimizer(t, s.trainable);
  if (s.precision.loss_scaling) s.scaler = std::make_unique<GradScaler>();
  if (s.device.is_cuda() && t.cupti) {
    // CUPTI has one activity client: under nsys (or another injected tool) mgbench stands aside.
    if (const std::string other = profile::external_cuda_profiler(); !other.empty()) {
      if (comm.rank() == 0) {
        log::warn("--cupti: {} holds CUPTI; mgbench's CUDA metrics are off for this run (the profiler records them)",
                  other);
      }
    } else {
      s.cupti = profile::CuptiCollector::create();
    }
  }
  // At least a byte: a positive --bucket-mb too small for one byte still means "one tensor a bucket".
  s.sync_options.bucket_bytes = std::max<std::size_t>(1, static_cast<std::size_t>(t.bucket_mb * 1024 * 1024));
  s.sync_options.first_bucket_bytes =
      std::max<std::size_t>(1, static_cast<std::size_t>(t.first_bucket_mb * 1024 * 1024));
  s.shared_buffers = recipe.shared_buffers();
  s.plan_options = {t.strategy, recipe.train_size(), t.batch_size, comm.world_size(), comm.rank(),
                    t.seed,     t.shuffle,           t.drop_last};
  if (!recipe.eval_only()) {
    s.steps_per_epoch = data::computed_batches_per_epoch(s.plan_options) / t.grad_accum;
    if (t.max_steps > 0) s.steps_per_epoch = std::min(s.steps_per_epoch, t.max_steps);
    MGBENCH_REQUIRE(s.steps_per_epoch > 0, ConfigError,
                    "{} samples over {} rank(s) at --batch-size {} x --grad-accum {} make no optimizer step",
                    recipe.train_size(), comm.world_size(), t.batch_size, t.grad_accum);
  }
}

TrainingLoop::~TrainingLoop() = default;

const char* TrainingLoop::throughput_unit() const { return state_->recipe.counts_tokens() ? "tok/s" : "img/s"; }

results::RankLayout TrainingLoop::layout() const {
  const auto& s = *state_;
  results::RankLayout l;
  if (s.recipe.eval_only()) {
    l.epochs = 1;
    l.steps_per_epoch = 1;
    return l;
  }
  l.epochs = s.train.epochs;
  l.steps_per_epoch = s.steps_per_epoch;
  l.cuda_metrics = s.cupti != nullptr;
  l.metrics = s.recipe.metric_names();
  if (s.train.record_indices) {
    const auto plan = cut_plan(data::plan_epoch(s.plan_options, 0), s.steps_per_epoch * s.train.grad_accum);
    for (const auto& b : plan) {
      if (b.compute) l.indices_per_epoch += static_cast<std::int64_t>(b.indices.size());
    }
  }
  return l;
}

h5::Attributes TrainingLoop::run_attributes() const {
  const auto& s = *state_;
  std::int64_t trainable = 0;
  for (const auto& p : s.trainable) trainable += p.numel();
  h5::Attributes a{
      {"device", std::string(s.device.is_cuda() ? "cuda" : "cpu")},
      {"backend", s.comm.backend()},
      {"trainable_parameters", trainable},
      {"allreduce_buckets",
       static_cast<std::int64_t>(s.distributed() ? runtime::GradSync::assign(s.trainable, s.sync_options).size() : 0)}};
  // The peak MFU divides by, and where it comes from: a run's MFU is read against it.
  const runtime::PeakFlops peak = run_peak_flops(s.placement, s.precision, s.train.peak_tflops);
  a.emplace_back("mfu_peak_tflops", peak.flops / 1e12);
  a.emplace_back("mfu_peak_source", peak.source);
  for (auto&& attribute : s.recipe.attributes()) a.push_back(std::move(attribute));
  return a;
}

h5::Attributes TrainingLoop::rank_attributes() const {
  const auto& s = *state_;
  h5::Attributes a{{"device", s.device.str()}, {"threads", static_cast<std::int64_t>(s.threads)}};
  if (s.device.is_cuda()) {
    a.emplace_back("gpu", runtime::cuda_device_description(s.placement.index));
    a.emplace_back("gpu_pci_bus_id", runtime::cuda_pci_bus_id(s.placement.index));
  }
  return a;
}

EvalResult TrainingLoop::evaluate() {
  auto& s = *state_;
  torch::NoGradGuard no_grad;
  if (s.share_buffers()) runtime::broadcast_coalesced(s.comm, s.shared_buffers, 0);  // every rank evaluates one model
  s.recipe.model().eval();
  const std::int64_t n = s.recipe.eval_size();
  const std::int64_t world = s.comm.world_size();
  const std::int64_t begin = n * s.comm.rank() / world;
  const std::int64_t end = n * (s.comm.rank() + 1) / world;
  // Summed on the device: one host sync per evaluation, not per batch. On the rank's device: the
  // NCCL backend reduces device tensors only.
  torch::Tensor sums = torch::zeros({s.recipe.eval_terms()}, torch::TensorOptions(torch::kFloat64).device(s.device));
  for (std::int64_t start = begin; start < end; start += s.train.batch_size) {
    std::vector<std::int64_t> indices;
    for (std::int64_t i = start; i < std::min(end, start + s.train.batch_size); ++i) indices.push_back(i);
    const data::Batch batch = s.recipe.transform(to_device(s.recipe.assemble_eval(indices), s.device));
    const AutocastScope autocast(s.precision, s.device.type());
    sums += s.recipe.eval_sums(batch);
  }
  s.comm.all_reduce(sums, runtime::ReduceOp::kSum)->wait();
  s.recipe.model().train();
  return s.recipe.eval_result(sums.cpu());
}

results::RunSummary TrainingLoop::run(results::ResultsWriter& writer, Progress& progress, RunControl& ctl) {
  auto& s = *state_;
  const auto& t = s.train;
  if (s.recipe.eval_only()) {
    results::RunSummary summary;
    const Stopwatch clock;
    const EvalResult e = evaluate();
    summary.eval_s = clock.elapsed();
    summary.total_s = clock.elapsed();
    summary.train_s = 0;
    summary.eval_loss = e.loss;
    summary.test_accuracy = e.accuracy;
    summary.final_loss = e.loss;
    summary.peak_memory_bytes = peak_memory_bytes(s.device);
    summary.finished_unix_s = static_cast<double>(std::time(nullptr));
    if (s.comm.rank() == 0) writer.write_summary(summary);
    return summary;
  }
  const auto layout = this->layout();
  const std::int64_t total_steps = s.steps_per_epoch * t.epochs;
  const std::int64_t micro_per_epoch = s.steps_per_epoch * t.grad_accum;
  const LossNormalization normalization = s.recipe.loss_normalization();
  const bool cosine = t.lr_schedule == LrSchedule::kCosine;

  // Where the run stands (a resumed run: where it stopped). position = plan entries of the epoch taken.
  RunProgress run;
  run.summary.train_s = 0;
  run.summary.eval_s = 0;
  std::int64_t computed_samples = 0;           // over the run, this rank
  std::int64_t tokens_total = 0;               // real tokens over the run, this rank
  std::int64_t padded_total = 0;               // padded tokens (batch x length) over the run, this rank
  double flops = 0;                            // model FLOPs over the run, this rank
  std::vector<std::int64_t> computed_indices;  // of the epoch in progress (--record-indices)
  const auto metric_count = static_cast<std::int64_t>(layout.metrics.size());
  std::vector<double> metric_rows;  // the recipe's per-step metrics of the epoch in progress, row-major
  const std::vector<std::pair<std::string, torch::Tensor>> checkpointed = s.recipe.checkpoint_tensors();
  auto put_state = [&](CheckpointState& state) {
    put_tensors(state, "model/", checkpointed);
    put_optimizer(state, "optimizer", *s.optimizer);
    if (s.scaler) {
      state.put("scaler.scale", s.scaler->get_scale());
      state.put("scaler.growth_tracker", s.scaler->growth_tracker());
    }
    put_rng(state, s.device);
    state.put("computed_samples", computed_samples);
    state.put("real_tokens", tokens_total);
    state.put("padded_tokens", padded_total);
    state.put("flops", flops);
    state.put_records<std::int64_t>("records/indices", computed_indices);
    state.put_records<double>("records/metrics", metric_rows);
  };
  if (ctl.resume != nullptr) {
    const CheckpointState& saved = *ctl.resume;
    load_tensors(saved, "model/", checkpointed);
    load_optimizer(saved, "optimizer", *s.optimizer);
    if (s.scaler) s.scaler->load_state(saved.number("scaler.scale"), saved.integer("scaler.growth_tracker"));
    load_rng(saved, s.device);
    run.load(saved);
    computed_samples = saved.integer("computed_samples");
    tokens_total = saved.integer("real_tokens");
    padded_total = saved.integer("padded_tokens");
    flops = saved.number("flops");
    computed_indices = saved.records<std::int64_t>("records/indices");
    metric_rows = saved.records<double>("records/metrics");
    MGBENCH_REQUIRE(run.epoch <= t.epochs, DataError, "checkpoint '{}': epoch {} is outside this run's {} epochs",
                    saved.source(), run.epoch + 1, t.epochs);
    log::info("resuming at epoch {} step {} (global step {})", run.epoch + 1, run.steps.size() + 1, run.global_step);
  }

  // DDP start-up: every rank starts from rank 0's trained parameters and shared buffers.
  runtime::broadcast_coalesced(s.comm, s.trainable, 0);
  if (s.share_buffers()) runtime::broadcast_coalesced(s.comm, s.shared_buffers, 0);
  if (s.distributed()) {
    s.grad_sync = std::make_unique<runtime::GradSync>(s.trainable, s.comm, s.sync_options);
    log::info("gradient sync: {} bucket(s), first {:.2f} MiB, then up to {:.1f} MiB", s.grad_sync->num_buckets(),
              t.first_bucket_mb, t.bucket_mb);
  }

  results::RunSummary& summary = run.summary;
  const double run_start_s = now_s() - run.elapsed_s;  // a resumed run's clock continues
  s.recipe.model().train();
  PhaseClock clock(s.device);

  // CUPTI collects while the profile window is open (checked at step boundaries).
  double window_open_s = results::kNaN;
  double window_closed_s = results::kNaN;
  std::int64_t window_samples = 0;
  auto update_profile_window = [&](double elapsed_s, std::int64_t step) {
    if (!s.cupti) return;
    const bool inside = s.window.contains(elapsed_s, step);
    if (inside && !s.cupti->running() && !std::isfinite(window_closed_s)) {
      s.cupti->start();
      window_open_s = elapsed_s;
    } else if (!inside && s.cupti->running()) {
      synchronize(s.device);
      s.cupti->stop();
      window_closed_s = now_s() - run_start_s;
    }
  };
  for (; run.epoch < t.epochs; ++run.epoch) {
    const std::int64_t epoch = run.epoch;
    const Stopwatch epoch_clock;
    results::EpochRecord& epoch_record = run.epoch_record;
    epoch_record.epoch = static_cast<std::int32_t>(epoch);
    std::vector<results::StepRecord>& steps = run.steps;
    steps.reserve(static_cast<std::size_t>(layout.steps_per_epoch));

    std::vector<data::PlannedBatch> plan = cut_plan(data::plan_epoch(s.plan_options, epoch), micro_per_epoch);
    MGBENCH_REQUIRE(run.position <= static_cast<std::int64_t>(plan.size()), DataError,
                    "checkpoint position: {} batches taken of epoch {}, which has {}", run.position, epoch + 1,
                    plan.size());
    plan.erase(plan.begin(), plan.begin() + run.position);  // a resumed epoch: the batches not yet taken
    // Page-locked batches only help (and only exist) for copies to a GPU.
    const bool pin = t.pin_memory && s.device.is_cuda();
    data::BatchLoader loader(
        std::move(plan),
        [&recipe = s.recipe](const data::PlannedBatch& p, bool pinned) { return recipe.assemble(p, pinned); },
        t.prefetch, pin);
    DeviceFeeder feeder(loader, s.device, /*async=*/pin, /*depth=*/std::max(2, t.prefetch));
    while (true) {
      results::StepRecord step;
      const double step_start = now_s();
      update_profile_window(step_start - run_start_s, run.global_step);
      const double lr = lr_at_step(t.lr, run.global_step, t.warmup_steps, total_steps, cosine);
      set_learning_rate(*s.optimizer, lr);
      step.lr = lr;
      s.recipe.begin_step(run.global_step);
      s.optimizer->zero_grad(/*set_to_none=*/true);

      // The step's micro-batches: forward and backward each, the all-reduce with the last one.
      torch::Tensor loss_sum;    // float64 on the device: one host sync per step, below
      torch::Tensor metric_sum;  // the recipe's metrics summed over the micro-batches, on the device
      torch::Tensor loss_scale;  // amp-fp16: the step's loss scale, float32 [] on the device
      double normalizer = 0;
      double step_flops = 0;
      std::int64_t micro = 0;
      while (micro < t.grad_accum) {
        std::optional<data::Batch> batch = feeder.next(clock);
        if (!batch) break;
        ++run.position;
        epoch_record.loaded_samples += batch->samples;
        // ddp-rr: this rank loads and transfers the batch but another rank computes it; the time
        // stays on the clock and is charged to the step that follows (or, after the last, the epoch).
        if (!batch->plan.compute) continue;
        if (micro == 0) step.batch_index = batch->plan.batch_index;
        if (s.share_buffers()) {
          clock.enter(results::Phase::kAllreduce);
          runtime::broadcast_coalesced(s.comm, s.shared_buffers, 0);
        }
        clock.enter(results::Phase::kTransform);
        const data::Batch input = s.recipe.transform(std::move(*batch));
        clock.enter(results::Phase::kForward);
        MicroBatchLoss out;
        {
          const AutocastScope autocast(s.precision, s.device.type());
          out = s.recipe.forward(input);
        }
        clock.enter(results::Phase::kBackward);
        if (micro + 1 == t.grad_accum && s.grad_sync) s.grad_sync->prepare();  // DDP's no_sync before the last
        if (s.scaler) {
          // The scale this step uses, read with the loss (no host sync between forward and backward).
          if (micro == 0) loss_scale = s.scaler->scale_tensor();
          s.scaler->scale(out.loss).backward();
        } else {
          out.loss.backward();
        }
        const torch::Tensor loss = out.loss.detach().to(torch::kFloat64).reshape({1});
        loss_sum = loss_sum.defined() ? loss_sum + loss : loss;
        if (metric_count > 0) {
          if (!out.metrics.defined() || out.metrics.numel() != metric_count) {
            throw std::logic_error("a recipe's forward returned other metrics than its metric_names()");
          }
          const torch::Tensor metrics = out.metrics.detach().to(torch::kFloat64);
          metric_sum = metric_sum.defined() ? metric_sum + metrics : metrics;
        }
        normalizer += out.normalizer;
        step.samples += input.samples;
        step.tokens += input.tokens;
        step.padded_tokens += input.padded_tokens;
        step_flops += s.recipe.flops(input);
        if (t.record_indices) {
          computed_indices.insert(computed_indices.end(), input.plan.indices.begin(), input.plan.indices.end());
        }
        ++micro;
      }
      if (micro == 0) break;  // the epoch's plan is done
      if (micro != t.grad_accum) throw std::logic_error("an epoch plan ended inside an optimizer step");

      // Gradients: the mean over ranks (GradSync), normalised as the recipe's loss says.
      clock.enter(results::Phase::kAllreduce);
      if (s.grad_sync) s.grad_sync->finish();
      double scale = 1.0;
      bool nothing_to_learn = false;
      if (normalization == LossNormalization::kMeanPerMicroBatch) {
        scale = 1.0 / static_cast<double>(micro);
      } else {
        torch::Tensor targets = torch::full({}, normalizer, torch::TensorOptions(torch::kFloat64).device(s.device));
        s.comm.all_reduce(targets, runtime::ReduceOp::kSum)->wait();
        const double all_targets = targets.cpu().item<double>();
        nothing_to_learn = all_targets <= 0;  // every label of the step masked
        if (!nothing_to_learn) scale = static_cast<double>(s.comm.world_size()) / all_targets;
      }
      clock.enter(results::Phase::kOptimizer);
      bool stepped = false;
      if (!nothing_to_learn) {
        if (scale != 1.0) {
          torch::NoGradGuard no_grad;
          for (auto& p : s.trainable) {
            if (p.grad().defined()) p.mutable_grad().mul_(scale);
          }
        }
        if (s.scaler) {
          if (t.clip_grad_norm > 0) {
            s.scaler->unscale(*s.optimizer);
            clip_grad_norm(s.trainable, t.clip_grad_norm);
          }
          stepped = s.scaler->step(*s.optimizer);
          s.scaler->update();
        } else {
          if (t.clip_grad_norm > 0) clip_grad_norm(s.trainable, t.clip_grad_norm);
          s.optimizer->step();
          stepped = true;
        }
      }
      // This rank's loss per target (per sample for a mean loss) and the recipe's metrics: the
      // step's one host sync.
      torch::Tensor on_device = metric_count > 0 ? torch::cat({loss_sum, metric_sum}) : loss_sum;
      if (loss_scale.defined()) {
        on_device = torch::cat({on_device, loss_scale.to(loss_sum.device()).to(torch::kFloat64).reshape({1})});
      }
      const torch::Tensor values = on_device.cpu();
      step.loss = normalizer > 0 ? values[0].item<double>() / normalizer : results::kNaN;
      if (loss_scale.defined()) step.loss_scale = values[values.numel() - 1].item<double>();
      for (std::int64_t k = 0; k < metric_count; ++k) {
        metric_rows.push_back(values[k + 1].item<double>() / static_cast<double>(micro));
      }
      step.phases = clock.take();
      if (s.grad_sync) {
        step.allreduce_window_s = s.grad_sync->window_s();
        epoch_record.allreduce_window_s += step.allreduce_window_s;
      }
      step.skipped = stepped ? 0 : 1;
      epoch_record.skipped_steps += step.skipped;
      step.epoch = static_cast<std::int32_t>(epoch);
      step.step = static_cast<std::int64_t>(steps.size());
      step.start_s = step_start - run_start_s;
      step.step_s = now_s() - step_start;
      if (!std::isfinite(step.loss) && normalizer > 0 && !s.scaler) {
        throw Error(fmt::format("loss became {} at epoch {} step {} (lr {}): training diverged; lower --lr", step.loss,
                                epoch + 1, step.step + 1, lr));
      }
      if (std::isfinite(step.loss)) {  // amp-fp16 steps skipped by the GradScaler have none
        run.loss_sum += step.loss;
        ++run.loss_steps;
      }
      if (s.window.contains(step.start_s, run.global_step)) window_samples += step.samples;
      epoch_record.samples += step.samples;
      epoch_record.phases += step.phases;
      tokens_total += step.tokens;
      padded_total += step.padded_tokens;
      flops += step_flops;
      steps.push_back(step);
      ++run.global_step;

      const double elapsed = now_s() - run_start_s;
      const double rate = s.recipe.counts_tokens() ? static_cast<double>(tokens_total) / elapsed
                                                   : static_cast<double>(epoch_record.samples) / epoch_clock.elapsed();
      progress.update(
          {static_cast<int>(epoch + 1), static_cast<int>(t.epochs), step.step + 1, s.steps_per_epoch, step.loss, rate,
           elapsed,
           elapsed / static_cast<double>(run.global_step) * static_cast<double>(total_steps - run.global_step)});

      // Step boundary: every rank learns of a stop request at the same step.
      if (at_step_boundary(ctl, run, now_s() - run_start_s, epoch_clock.elapsed(), writer, put_state)) {
        writer.write_steps(epoch, steps);  // the epoch's steps so far; its row is written when it ends
        if (metric_count > 0) writer.write_metrics(epoch, metric_rows);
        summary.total_s = now_s() - run_start_s;
        return summary;
      }
    }
    // The end of the epoch's plan (and, ddp-rr, batches loaded after this rank's last computed one)
    // belong to the epoch, not a step: taken here, before evaluation, which is not training time.
    epoch_record.phases += clock.take();
    epoch_record.train_s = run.epoch_elapsed_s + epoch_clock.elapsed();
    epoch_record.steps = static_cast<std::int64_t>(steps.size());
    epoch_record.loss_mean = run.loss_steps == 0 ? results::kNaN : run.loss_sum / static_cast<double>(run.loss_steps);
    epoch_record.samples_per_s = static_cast<double>(epoch_record.samples) / epoch_record.train_s;
    computed_samples += epoch_record.samples;
    summary.train_s += epoch_record.train_s;

    if (s.recipe.eval_size() > 0 && ((epoch + 1) % t.eval_every == 0 || epoch + 1 == t.epochs)) {
      const Stopwatch eval_clock;
      const EvalResult e = evaluate();
      epoch_record.eval_s = eval_clock.elapsed();
      epoch_record.test_correct = e.correct;
      epoch_record.test_samples = e.samples;
      epoch_record.test_accuracy = e.accuracy;
      epoch_record.eval_loss = e.loss;
      summary.eval_s += epoch_record.eval_s;
      summary.test_accuracy = e.accuracy;
      summary.eval_loss = e.loss;
    }
    writer.write_steps(epoch, steps);
    writer.write_epoch(epoch_record);
    if (t.record_indices) writer.write_indices(epoch, computed_indices);
    if (metric_count > 0) writer.write_metrics(epoch, metric_rows);
    summary.final_loss = epoch_record.loss_mean;
    summary.epochs_completed = epoch + 1;
    std::int64_t epoch_tokens = 0;
    for (const auto& step : steps) epoch_tokens += step.tokens;
    const double rate = s.recipe.counts_tokens() ? static_cast<double>(epoch_tokens) / epoch_record.train_s
                                                 : epoch_record.samples_per_s;
    std::string evaluated;
    if (std::isfinite(epoch_record.test_accuracy)) {
      evaluated = fmt::format(" | test accuracy {:.2f} % ({}/{})", 100 * epoch_record.test_accuracy,
                              epoch_record.test_correct, epoch_record.test_samples);
    } else if (std::isfinite(epoch_record.eval_loss)) {
      evaluated = fmt::format(" | eval loss {:.4f}", epoch_record.eval_loss);
    }
    progress.message(fmt::format("epoch {}/{}: loss {:.4f} | {:.1f} {} per rank | {:.3f} s/it | train {:.1f} s{}",
                                 epoch + 1, t.epochs, epoch_record.loss_mean, rate, throughput_unit(),
                                 epoch_record.train_s / static_cast<double>(std::max<std::size_t>(steps.size(), 1)),
                                 epoch_record.train_s, evaluated));
    run.next_epoch();
    computed_indices.clear();
    metric_rows.clear();
  }
  summary.total_s = now_s() - run_start_s;
  if (s.cupti) {
    if (s.cupti->running()) {
      synchronize(s.device);
      s.cupti->stop();
      window_closed_s = now_s() - run_start_s;
    }
    results::CudaSummaryRecord cuda;
    const auto& totals = s.cupti->totals();
    totals.fill_summary(cuda);
    cuda.window_start_s = window_open_s;
    cuda.window_s = window_closed_s - window_open_s;
    cuda.samples = window_samples;
    std::tie(cuda.peak_allocated_bytes, cuda.peak_reserved_bytes) = device_memory_peaks(s.device);
    writer.write_cuda_metrics(cuda, totals.api_rows(), totals.kernel_rows());
  }

  // Figures of all ranks: samples and tokens computed, FLOPs, the mean final loss over ranks.
  torch::Tensor totals = torch::tensor({static_cast<double>(computed_samples), summary.final_loss,
                                        static_cast<double>(tokens_total), flops, static_cast<double>(padded_total)},
                                       torch::kFloat64)
                             .to(s.device);
  s.comm.all_reduce(totals, runtime::ReduceOp::kSum)->wait();
  totals = totals.cpu();
  const double world = static_cast<double>(s.comm.world_size());
  summary.samples_per_s = totals[0].item<double>() / summary.train_s;
  summary.final_loss = totals[1].item<double>() / world;
  summary.s_per_it = summary.train_s / static_cast<double>(std::max<std::int64_t>(run.global_step, 1));
  summary.tokens_per_s = totals[2].item<double>() > 0 ? totals[2].item<double>() / summary.train_s : results::kNaN;
  summary.padded_tokens_per_s =
      totals[4].item<double>() > 0 ? totals[4].item<double>() / summary.train_s : results::kNaN;
  summary.mfu = totals[3].item<double>() /
                (summary.train_s * world * run_peak_flops(s.placement, s.precision, t.peak_tflops).flops);
  summary.peak_memory_bytes = peak_memory_bytes(s.device);
  summary.finished_unix_s = static_cast<double>(std::time(nullptr));
  if (s.comm.rank() == 0) writer.write_summary(summary);
  run.elapsed_s = summary.total_s;
  save_checkpoint(ctl, run, /*completed=*/true, writer, put_state);  // a later --resume finds the run done
  return summary;
}

}  // namespace mgbench::train
