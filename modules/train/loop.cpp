#include "train/loop.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/loader.h"
#include "data/sampler.h"
#include "profile/cupti_collector.h"
#include "profile/nvtx.h"
#include "runtime/communicator.h"
#include "runtime/grad_sync.h"
#include "runtime/peak_flops.h"
#include "session/session.h"
#include "train/device_pipeline.h"
#include "train/loop_parts.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"
#include "train/precision.h"
#include "train/step.h"

namespace mgbench::train {
namespace {

/// The peak FLOP/s for MFU of this run's device and arithmetic (runtime/peak_flops.h).
runtime::PeakFlops run_peak_flops(const runtime::DevicePlacement& p, const axes::PrecisionInfo& precision,
                                  double configured_tflops) {
  const axes::Dtype dtype = precision.autocast ? precision.autocast_dtype : precision.param_dtype;
  const runtime::MathKind kind = dtype == axes::Dtype::kBFloat16  ? runtime::MathKind::kBf16
                                 : dtype == axes::Dtype::kFloat16 ? runtime::MathKind::kFp16
                                 : dtype == axes::Dtype::kFloat64 ? runtime::MathKind::kFp64
                                 : precision.tf32                 ? runtime::MathKind::kTf32
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

/// The rank's CPU threads: as asked, else the node's cores shared by its ranks -- but never more
/// than this rank may run on (its affinity: a launcher that binds it to one core makes more threads
/// share it).
int thread_count(const TrainOptions& t, int local_size) {
  const int bound = runtime::available_cores();
  const int share = std::max(1, runtime::machine_cores() / std::max(1, local_size));
  const int threads = t.threads > 0 ? t.threads : std::min(share, bound);
  if (t.threads > bound) {
    log::warn(
        "--threads {}: this rank may run on {} core(s) only (its CPU affinity, set by the launcher: Open MPI "
        "binds each rank to one core when np <= 2; --bind-to none, or --map-by slot:PE={} gives it more)",
        t.threads, bound, t.threads);
  } else if (t.threads == 0 && bound < share) {
    log::info("threads: {} per rank, the cores its CPU affinity allows ({} would be this node's share)", threads,
              share);
  }
  return threads;
}

}  // namespace

TrainingLoop::TrainingLoop(const TrainOptions& train, Recipe& recipe, runtime::Communicator& comm,
                           runtime::DevicePlacement placement, int local_size)
    : parts_(std::make_unique<LoopParts>(train, recipe, comm, placement)) {
  auto& s = *parts_;
  const auto& t = s.train;
  const axes::StrategyInfo& strategy = axes::strategy_info(t.strategy);
  MGBENCH_REQUIRE(!strategy.single_process || comm.world_size() == 1, ConfigError,
                  "--strategy {} is single-process (one rank drives the GPUs): start 1 rank, not {}", strategy.name,
                  comm.world_size());
  s.threads = thread_count(t, local_size);
  s.device = to_torch_device(placement);
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
  for (const auto& p : s.trainable) s.trainable_numel += p.numel();
  if (t.sharding == Sharding::kFsdp) {
    models::ShardableModel* model = recipe.shardable_model();
    MGBENCH_REQUIRE(model != nullptr, ConfigError,
                    "--sharding fsdp: this recipe's model has no FSDP units; use --sharding none");
    // What a micro-batch gathers and reduce-scatters, recorded at any world size (one rank too: the
    // base `mgbench predict` prices FSDP from).
    const std::vector<models::ParameterUnit> units = model->parameter_units();
    const std::int64_t element =
        units.empty() || units.front().parameters.empty() ? 0 : units.front().parameters.front().element_size();
    s.fsdp_collectives = micro_batch_collectives(unit_shapes(units), 1, element, t.reshard_after_forward);
    // One rank: nothing to shard, the run is --sharding none's.
    if (comm.world_size() > 1) {
      s.fsdp = std::make_unique<FullyShardedUnits>(*model, comm, t.reshard_after_forward);
      s.trainable = s.fsdp->trainable_shards();
    }
  }
  s.optimizer = make_optimizer(t, s.trainable);
  // Under FSDP the ranks agree on a non-finite gradient shard (torch's ShardedGradScaler).
  if (s.precision.loss_scaling) s.scaler = std::make_unique<GradScaler>(GradScalerOptions{}, s.fsdp ? &comm : nullptr);
  s.cupti.set(make_cupti(s), profile::parse_profile_window(t.profile_window));
  // At least a byte: a positive --bucket-mb too small for one byte still means "one tensor a bucket".
  s.sync_options.bucket_bytes = std::max<std::size_t>(1, static_cast<std::size_t>(t.bucket_mb * 1024 * 1024));
  s.sync_options.first_bucket_bytes =
      std::max<std::size_t>(1, static_cast<std::size_t>(t.first_bucket_mb * 1024 * 1024));
  s.shared_buffers = recipe.shared_buffers();
  s.metric_count = static_cast<std::int64_t>(recipe.metric_names().size());
  s.plan_options = {t.strategy, recipe.train_size(), t.batch_size, comm.world_size(),         comm.rank(),
                    t.seed,     t.shuffle,           t.drop_last,  recipe.train_shard_sizes()};
  if (!recipe.eval_only()) {
    s.steps_per_epoch = axes::steps_per_epoch(strategy, data::epoch_shape(s.plan_options), t.grad_accum, t.max_steps);
    MGBENCH_REQUIRE(s.steps_per_epoch > 0, ConfigError,
                    "{} samples over {} rank(s) at --batch-size {} x --grad-accum {} make no optimizer step",
                    recipe.train_size(), comm.world_size(), t.batch_size, t.grad_accum);
  }
}

TrainingLoop::~TrainingLoop() = default;

const char* TrainingLoop::throughput_unit() const { return parts_->recipe.counts_tokens() ? "tok/s" : "img/s"; }

results::RankLayout TrainingLoop::layout() const {
  const auto& s = *parts_;
  results::RankLayout l;
  if (s.recipe.eval_only()) {
    l.epochs = 1;
    l.steps_per_epoch = 1;
    return l;
  }
  l.epochs = s.train.epochs;
  l.steps_per_epoch = s.steps_per_epoch;
  l.cuda_metrics = s.cupti.collector() != nullptr;
  l.metrics = s.recipe.metric_names();
  if (s.train.record_indices) {
    const auto plan = cut_plan(data::plan_epoch(s.plan_options, 0), s.steps_per_epoch * s.train.grad_accum);
    for (const auto& b : plan) {
      if (b.compute) l.indices_per_epoch += static_cast<std::int64_t>(b.indices.size());
    }
  }
  return l;
}

namespace {

/// What a rank holds of the model, in bytes: parameters (the whole model, NF4 weights' packed parts
/// included; under FSDP its shards and the units gathered at the peak), gradients (of what the
/// optimizer trains) and the optimizer's states. Activations and buffers are not counted.
h5::Attributes memory_attributes(const LoopParts& s) {
  std::int64_t parameters = 0;
  std::int64_t gradients = 0;
  if (s.fsdp) {
    const ShardedMemory m = s.fsdp->memory();
    parameters = m.shard_bytes + m.gathered_peak_bytes;
    gradients = m.trainable_shard_bytes;
  } else {
    for (const auto& p : s.recipe.model().parameters()) parameters += static_cast<std::int64_t>(p.nbytes());
    for (const auto& p : s.trainable) gradients += static_cast<std::int64_t>(p.nbytes());
    // Packed weights (NF4) too, as FSDP counts them.
    if (models::ShardableModel* model = s.recipe.shardable_model()) {
      for (const UnitShape& u : unit_shapes(model->parameter_units())) parameters += u.packed_bytes;
    }
  }
  return {{"parameter_bytes_per_rank", parameters},
          {"gradient_bytes_per_rank", gradients},
          {"optimizer_state_bytes_per_rank", optimizer_states_per_element(s.train) * gradients}};
}

}  // namespace

h5::Attributes TrainingLoop::run_attributes() const {
  const auto& s = *parts_;
  const bool buckets = s.distributed() && !s.fsdp;
  h5::Attributes a{
      {"device", std::string(s.device.is_cuda() ? "cuda" : "cpu")},
      {"backend", s.comm.backend()},
      {"trainable_parameters", s.trainable_numel},
      {"gradient_dtype", std::string(axes::dtype_info(s.precision.gradient_dtype()).name)},
      {"allreduce_buckets",
       static_cast<std::int64_t>(buckets ? runtime::GradSync::assign(s.trainable, s.sync_options).size() : 0)},
      {"fsdp_units", s.fsdp ? s.fsdp->num_units() : std::int64_t{0}},
      {"fsdp_allgather_bytes", fmt::format("{}", fmt::join(s.fsdp_collectives.all_gather_bytes, ","))},
      {"fsdp_reducescatter_bytes", fmt::format("{}", fmt::join(s.fsdp_collectives.reduce_scatter_bytes, ","))},
      // What a step broadcasts before each micro-batch and all-reduces for its loss, at any world size.
      {"buffer_broadcast_bytes",
       fmt::format("{}", fmt::join(runtime::broadcast_coalesced_bytes(s.shared_buffers), ","))},
      {"loss_allreduce_bytes",
       std::int64_t{s.recipe.loss_normalization() == LossNormalization::kMeanPerMicroBatch ? 0 : 8}}};
  // The peak MFU divides by, and where it comes from: a run's MFU is read against it.
  const runtime::PeakFlops peak = run_peak_flops(s.placement, s.precision, s.train.peak_tflops);
  a.emplace_back("mfu_peak_tflops", peak.flops / 1e12);
  a.emplace_back("mfu_peak_source", peak.source);
  for (auto&& attribute : memory_attributes(s)) a.push_back(std::move(attribute));
  for (auto&& attribute : s.recipe.attributes()) a.push_back(std::move(attribute));
  return a;
}

h5::Attributes TrainingLoop::rank_attributes() const {
  const auto& s = *parts_;
  h5::Attributes a{{"device", s.device.str()}, {"threads", static_cast<std::int64_t>(s.threads)}};
  h5::merge_attributes(a, session::gpu_attributes(s.placement));
  return a;
}

void TrainingLoop::state_dict(CheckpointState& state) const {
  const auto& s = *parts_;
  put_tensors(state, "model/", s.checkpoint_tensors());
  put_optimizer(state, "optimizer", *s.optimizer);
  if (s.scaler) {
    state.put("scaler.scale", s.scaler->get_scale());
    state.put("scaler.growth_tracker", s.scaler->growth_tracker());
  }
  put_rng(state, s.device);
  s.progress.save(state);
}

void TrainingLoop::load_state_dict(const CheckpointState& state) {
  auto& s = *parts_;
  load_tensors(state, "model/", s.checkpoint_tensors());
  load_optimizer(state, "optimizer", *s.optimizer);
  if (s.scaler) s.scaler->load_state(state.number("scaler.scale"), state.integer("scaler.growth_tracker"));
  load_rng(state, s.device);
  s.progress.load(state);
  MGBENCH_REQUIRE(s.progress.epoch <= s.train.epochs, DataError,
                  "checkpoint '{}': epoch {} is outside this run's {} epochs", state.source(), s.progress.epoch + 1,
                  s.train.epochs);
}

namespace {

/// FSDP: frees every gathered unit after work outside a step (evaluation, exports); their
/// collectives' times are not a step's. Nothing without FSDP.
void release_units(LoopParts& s) {
  if (!s.fsdp) return;
  s.fsdp->reshard_all();
  s.fsdp->take_collectives();
}

}  // namespace

EvalResult TrainingLoop::evaluate() {
  auto& s = *parts_;
  torch::NoGradGuard no_grad;
  if (s.share_buffers()) runtime::broadcast_coalesced(s.comm, s.shared_buffers, 0);  // every rank evaluates one model
  s.recipe.model().eval();
  const std::int64_t n = s.recipe.eval_size();
  const std::int64_t world = s.comm.world_size();
  const std::int64_t b = s.train.batch_size;
  const std::int64_t begin = n * s.comm.rank() / world;
  const std::int64_t end = n * (s.comm.rank() + 1) / world;
  // FSDP gathers each unit in every forward, a collective: every rank runs as many batches as the
  // largest shard needs, one whose shard ends sooner a batch of one sample whose sums are dropped.
  const std::int64_t batches = s.fsdp ? ((n + world - 1) / world + b - 1) / b : (end - begin + b - 1) / b;
  // Summed on the device: one host sync per evaluation, not per batch. On the rank's device: the
  // NCCL backend reduces device tensors only.
  torch::Tensor sums = torch::zeros({s.recipe.eval_terms()}, torch::TensorOptions(torch::kFloat64).device(s.device));
  for (std::int64_t k = 0; k < batches; ++k) {
    const std::int64_t start = begin + k * b;
    std::vector<std::int64_t> indices;
    for (std::int64_t i = start; i < std::min(end, start + b); ++i) indices.push_back(i);
    const bool filler = indices.empty();
    if (filler) indices.push_back(std::min(begin, n - 1));
    const data::Batch batch = s.recipe.transform(s.recipe.prepare_on_device(
        to_device(s.recipe.assemble_eval(indices), s.device, profile::CopyPurpose::kEvalBatch)));
    const AutocastScope autocast(s.precision, s.device.type());
    const torch::Tensor batch_sums = s.recipe.eval_sums(batch);
    if (!filler) sums += batch_sums;
  }
  release_units(s);
  s.comm.all_reduce(sums, runtime::ReduceOp::kSum)->wait();
  s.recipe.model().train();
  return s.recipe.eval_result(sums.cpu());
}

std::vector<torch::Tensor> TrainingLoop::trained_parameters() {
  auto& s = *parts_;
  if (s.fsdp) s.fsdp->gather_all();
  std::vector<torch::Tensor> copies;
  for (const auto& p : s.recipe.trainable_parameters()) copies.push_back(p.detach().clone());
  release_units(s);
  return copies;
}

void TrainingLoop::finish(int rank) {
  auto& s = *parts_;
  if (s.fsdp) s.fsdp->gather_all();
  s.recipe.finish(rank);
  release_units(s);
}

// --- the run's phases ----------------------------------------------------------------------------

namespace {

/// A run of an evaluate-only recipe: one evaluation, its summary.
results::RunSummary evaluation_run(LoopParts& s, TrainingLoop& loop, results::ResultsWriter& writer) {
  results::RunSummary summary;
  const Stopwatch clock;
  const EvalResult e = loop.evaluate();
  summary.eval_s = clock.elapsed();
  summary.total_s = clock.elapsed();
  summary.train_s = 0;
  summary.eval_loss = e.loss;
  summary.test_accuracy = e.accuracy;
  summary.final_loss = e.loss;
  summary.peak_memory_bytes = peak_memory_bytes(s.device);
  summary.finished_unix_s = static_cast<double>(std::time(nullptr));
  summary.set_transports(runtime::gather_transports(s.comm, s.device, results::kTransportsBytes));
  if (s.comm.rank() == 0) writer.write_summary(summary);
  return summary;
}

/// DDP's start: every rank from rank 0's trained parameters and shared buffers, and the gradient
/// buckets' all-reduce hooked into backward.
void replicate(LoopParts& s) {
  if (s.fsdp) return;  // each rank holds its shards; gradients are reduce-scattered by the units
  runtime::broadcast_coalesced(s.comm, s.trainable, 0);
  if (s.share_buffers()) runtime::broadcast_coalesced(s.comm, s.shared_buffers, 0);
  if (!s.distributed()) return;
  s.grad_sync = std::make_unique<runtime::GradSync>(s.trainable, s.comm, s.sync_options);
  log::info("gradient sync: {} bucket(s), first {:.2f} MiB, then up to {:.1f} MiB", s.grad_sync->num_buckets(),
            s.train.first_bucket_mb, s.train.bucket_mb);
}

/// A step's outcome into the run's records; throws Error when the loss diverged.
void record_step(LoopParts& s, StepOutcome& out, double step_start, double run_start_s) {
  RunProgress& run = s.progress;
  results::StepRecord& step = out.record;
  results::EpochRecord& epoch_record = run.epoch_record;
  if (s.grad_sync) epoch_record.allreduce_window_s += step.allreduce_window_s;
  epoch_record.allgather_s += step.allgather_s;
  epoch_record.reducescatter_s += step.reducescatter_s;
  epoch_record.skipped_steps += step.skipped;
  step.epoch = static_cast<std::int32_t>(run.epoch);
  step.step = static_cast<std::int64_t>(run.steps.size());
  step.start_s = step_start - run_start_s;
  step.step_s = now_s() - step_start;
  if (!std::isfinite(step.loss) && out.normalizer > 0 && !s.scaler) {
    throw Error(fmt::format("loss became {} at epoch {} step {} (lr {}): training diverged; lower --lr", step.loss,
                            run.epoch + 1, step.step + 1, step.lr));
  }
  if (std::isfinite(step.loss)) {  // amp-fp16 steps skipped by the GradScaler have none
    run.loss_sum += step.loss;
    ++run.loss_steps;
  }
  s.cupti.count(step.start_s, run.global_step, step.samples);
  epoch_record.samples += step.samples;
  epoch_record.phases += step.phases;
  run.real_tokens += step.tokens;
  run.padded_tokens += step.padded_tokens;
  run.flops += out.flops;
  run.metric_rows.insert(run.metric_rows.end(), out.metrics.begin(), out.metrics.end());
  run.computed_indices.insert(run.computed_indices.end(), out.indices.begin(), out.indices.end());
  run.steps.push_back(step);
  ++run.global_step;
}

/// The epoch's steps, each followed by the step boundary. False when the job agreed to stop: the
/// epoch's steps so far are written (its row is written when it ends, after a resume).
bool train_epoch(LoopParts& s, const TrainingLoop& loop, PhaseClock& clock, const Stopwatch& epoch_clock,
                 results::ResultsWriter& writer, Progress& progress, RunControl& ctl, double run_start_s) {
  const auto& t = s.train;
  RunProgress& run = s.progress;
  run.epoch_record.epoch = static_cast<std::int32_t>(run.epoch);
  run.steps.reserve(static_cast<std::size_t>(s.steps_per_epoch));
  std::vector<data::PlannedBatch> plan =
      cut_plan(data::plan_epoch(s.plan_options, run.epoch), s.steps_per_epoch * t.grad_accum);
  MGBENCH_REQUIRE(run.position <= static_cast<std::int64_t>(plan.size()), DataError,
                  "checkpoint position: {} batches taken of epoch {}, which has {}", run.position, run.epoch + 1,
                  plan.size());
  plan.erase(plan.begin(), plan.begin() + run.position);  // a resumed epoch: the batches not yet taken
  // Page-locked batches only help (and only exist) for copies to a GPU.
  const bool pin = t.pin_memory && s.device.is_cuda();
  data::BatchLoader loader(
      std::move(plan),
      [&recipe = s.recipe](const data::PlannedBatch& p, bool pinned) { return recipe.assemble(p, pinned); }, t.prefetch,
      pin);
  DeviceFeeder feeder(loader, s.device, /*async=*/pin, /*depth=*/std::max(2, t.prefetch),
                      [&recipe = s.recipe](data::Batch b) { return recipe.prepare_on_device(std::move(b)); });
  const std::int64_t total_steps = s.steps_per_epoch * t.epochs;
  const bool cosine = t.lr_schedule == LrSchedule::kCosine;
  while (true) {
    const double step_start = now_s();
    s.cupti.update(step_start - run_start_s, run.global_step, s.device, run_start_s);
    const double lr = lr_at_step(t.lr, run.global_step, t.warmup_steps, total_steps, cosine);
    StepOutcome out = train_step(s, feeder, clock, lr, run.global_step);
    run.position += out.loaded_batches;
    run.epoch_record.loaded_samples += out.loaded_samples;
    run.epoch_record.skipped_images += out.skipped_images;
    if (out.micro_batches == 0) return true;  // the epoch's plan is done
    record_step(s, out, step_start, run_start_s);
    if (run.global_step == t.warmup_steps_excluded && !run.warmup.taken) {  // the warm-up's end
      run.warmup = {true,
                    run.summary.train_s + run.epoch_elapsed_s + epoch_clock.elapsed(),
                    run.computed_samples + run.epoch_record.samples,
                    run.real_tokens,
                    run.padded_tokens,
                    run.flops};
    }

    const double elapsed = now_s() - run_start_s;
    const double rate = s.recipe.counts_tokens()
                            ? static_cast<double>(run.real_tokens) / elapsed
                            : static_cast<double>(run.epoch_record.samples) / epoch_clock.elapsed();
    progress.update(
        {static_cast<int>(run.epoch + 1), static_cast<int>(t.epochs), out.record.step + 1, s.steps_per_epoch,
         out.record.loss, rate, elapsed,
         elapsed / static_cast<double>(run.global_step) * static_cast<double>(total_steps - run.global_step)});

    // Step boundary: every rank learns of a stop request at the same step.
    const auto state_dict = [&loop](CheckpointState& state) { loop.state_dict(state); };
    if (at_step_boundary(ctl, run, now_s() - run_start_s, epoch_clock.elapsed(), writer, state_dict)) {
      writer.write_steps(run.epoch, run.steps);
      if (s.metric_count > 0) writer.write_metrics(run.epoch, run.metric_rows);
      return false;
    }
  }
}

/// The epoch's end: its record, the evaluation when due, its rows written, progress.
void end_epoch(LoopParts& s, TrainingLoop& loop, PhaseClock& clock, const Stopwatch& epoch_clock,
               results::ResultsWriter& writer, Progress& progress) {
  const auto& t = s.train;
  RunProgress& run = s.progress;
  results::EpochRecord& e = run.epoch_record;
  results::RunSummary& summary = run.summary;
  // The end of the epoch's plan (and, ddp-rr, batches loaded after this rank's last computed one)
  // belong to the epoch, not a step: taken here, before evaluation, which is not training time.
  e.phases += clock.take();
  e.train_s = run.epoch_elapsed_s + epoch_clock.elapsed();
  e.steps = static_cast<std::int64_t>(run.steps.size());
  e.loss_mean = run.loss_steps == 0 ? results::kNaN : run.loss_sum / static_cast<double>(run.loss_steps);
  e.samples_per_s = static_cast<double>(e.samples) / e.train_s;
  run.computed_samples += e.samples;
  summary.train_s += e.train_s;

  if (s.recipe.eval_size() > 0 && ((run.epoch + 1) % t.eval_every == 0 || run.epoch + 1 == t.epochs)) {
    const Stopwatch eval_clock;
    const EvalResult result = loop.evaluate();
    e.eval_s = eval_clock.elapsed();
    e.test_correct = result.correct;
    e.test_samples = result.samples;
    e.test_accuracy = result.accuracy;
    e.eval_loss = result.loss;
    summary.eval_s += e.eval_s;
    summary.test_accuracy = result.accuracy;
    summary.eval_loss = result.loss;
  }
  writer.write_steps(run.epoch, run.steps);
  writer.write_epoch(e);
  if (t.record_indices) writer.write_indices(run.epoch, run.computed_indices);
  if (s.metric_count > 0) writer.write_metrics(run.epoch, run.metric_rows);
  summary.final_loss = e.loss_mean;
  summary.epochs_completed = run.epoch + 1;
  std::int64_t epoch_tokens = 0;
  for (const auto& step : run.steps) epoch_tokens += step.tokens;
  const double rate = s.recipe.counts_tokens() ? static_cast<double>(epoch_tokens) / e.train_s : e.samples_per_s;
  std::string evaluated;
  if (std::isfinite(e.test_accuracy)) {
    evaluated = fmt::format(" | test accuracy {:.2f} % ({}/{})", 100 * e.test_accuracy, e.test_correct, e.test_samples);
  } else if (std::isfinite(e.eval_loss)) {
    evaluated = fmt::format(" | eval loss {:.4f}", e.eval_loss);
  }
  progress.message(fmt::format("epoch {}/{}: loss {:.4f} | {:.1f} {} per rank | {:.3f} s/it | train {:.1f} s{}",
                               run.epoch + 1, t.epochs, e.loss_mean, rate, loop.throughput_unit(),
                               e.train_s / static_cast<double>(std::max<std::size_t>(run.steps.size(), 1)), e.train_s,
                               evaluated));
  run.next_epoch();
}

/// The run's end: CUDA metrics, the figures of all ranks in the summary (rank 0 writes it), the
/// final checkpoint (a later --resume finds the run done).
results::RunSummary finish_run(LoopParts& s, const TrainingLoop& loop, results::ResultsWriter& writer, RunControl& ctl,
                               double run_start_s) {
  RunProgress& run = s.progress;
  results::RunSummary& summary = run.summary;
  summary.total_s = now_s() - run_start_s;
  if (profile::CuptiCollector* cupti = s.cupti.collector()) {
    s.cupti.close(s.device, run_start_s);
    results::CudaSummaryRecord cuda;
    const auto& totals = cupti->totals();
    totals.fill_summary(cuda);
    cuda.window_start_s = s.cupti.opened_s();
    cuda.window_s = s.cupti.closed_s() - s.cupti.opened_s();
    cuda.samples = s.cupti.samples();
    std::tie(cuda.peak_allocated_bytes, cuda.peak_reserved_bytes) = device_memory_peaks(s.device);
    writer.write_cuda_metrics(cuda, totals.api_rows(), totals.kernel_rows());
  }
  // Figures of all ranks: samples and tokens computed, FLOPs, the mean final loss over ranks; with
  // --warmup-steps-excluded, those after the warm-up (and whether every rank got past it).
  const std::int64_t warmup_steps = s.train.warmup_steps_excluded;
  const RunProgress::Warmup& w = run.warmup;
  torch::Tensor totals = torch::tensor({static_cast<double>(run.computed_samples - w.samples), summary.final_loss,
                                        static_cast<double>(run.real_tokens - w.real_tokens), run.flops - w.flops,
                                        static_cast<double>(run.padded_tokens - w.padded_tokens), w.taken ? 1.0 : 0.0},
                                       torch::kFloat64)
                             .to(s.device);
  s.comm.all_reduce(totals, runtime::ReduceOp::kSum)->wait();
  totals = totals.cpu();
  const double world = static_cast<double>(s.comm.world_size());
  summary.final_loss = totals[1].item<double>() / world;
  // The time and steps the rates are over: rank 0's training time, as train_s, less its warm-up.
  double span_s = summary.train_s - w.train_s;
  const std::int64_t span_steps = run.global_step - warmup_steps;
  if (warmup_steps > 0 && totals[5].item<double>() < world) {
    log::warn("--warmup-steps-excluded {}: the run has {} optimizer step(s): no throughput after the warm-up",
              warmup_steps, run.global_step);
    span_s = results::kNaN;
  }
  summary.samples_per_s = totals[0].item<double>() / span_s;
  summary.s_per_it = span_s / static_cast<double>(std::max<std::int64_t>(span_steps, 1));
  summary.tokens_per_s = totals[2].item<double>() > 0 ? totals[2].item<double>() / span_s : results::kNaN;
  summary.padded_tokens_per_s = totals[4].item<double>() > 0 ? totals[4].item<double>() / span_s : results::kNaN;
  summary.mfu =
      totals[3].item<double>() / (span_s * world * run_peak_flops(s.placement, s.precision, s.train.peak_tflops).flops);
  summary.peak_memory_bytes = peak_memory_bytes(s.device);
  summary.finished_unix_s = static_cast<double>(std::time(nullptr));
  summary.set_transports(runtime::gather_transports(s.comm, s.device, results::kTransportsBytes));
  if (s.comm.rank() == 0) writer.write_summary(summary);
  run.elapsed_s = summary.total_s;
  save_checkpoint(ctl, run, /*completed=*/true, writer, [&loop](CheckpointState& state) { loop.state_dict(state); });
  return summary;
}

}  // namespace

results::RunSummary TrainingLoop::run(results::ResultsWriter& writer, Progress& progress, RunControl& ctl) {
  auto& s = *parts_;
  if (s.recipe.eval_only()) return evaluation_run(s, *this, writer);
  // Where the run starts: a checkpoint's state (the run's clock continues), or afresh.
  RunProgress& run = s.progress;
  run = RunProgress{};
  run.summary.train_s = 0;
  run.summary.eval_s = 0;
  if (ctl.resume != nullptr) {
    load_state_dict(*ctl.resume);
    log::info("resuming at epoch {} step {} (global step {})", run.epoch + 1, run.steps.size() + 1, run.global_step);
  }
  replicate(s);
  const double run_start_s = now_s() - run.elapsed_s;
  s.recipe.model().train();
  PhaseClock clock(s.device);
  for (; run.epoch < s.train.epochs; ++run.epoch) {
    const Stopwatch epoch_clock;
    if (!train_epoch(s, *this, clock, epoch_clock, writer, progress, ctl, run_start_s)) {
      run.summary.total_s = now_s() - run_start_s;  // stopped: the partial summary, not written
      return run.summary;
    }
    end_epoch(s, *this, clock, epoch_clock, writer, progress);
  }
  return finish_run(s, *this, writer, ctl, run_start_s);
}

}  // namespace mgbench::train
