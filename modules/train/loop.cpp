#include "train/loop.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/host_memory.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/sampler.h"
#include "profile/nvtx.h"
#include "runtime/communicator.h"
#include "runtime/cpu_allocator.h"
#include "runtime/grad_sync.h"
#include "runtime/stop_request.h"
#include "session/session.h"
#include "train/device_pipeline.h"
#include "train/epoch.h"
#include "train/loop_state.h"
#include "train/optim/lr_schedule.h"
#include "train/optim/optimizer.h"
#include "train/parallel/unit_sharder.h"
#include "train/precision.h"
#include "train/run_summary.h"
#include "train/tensor_export.h"

namespace mgbench::train {
namespace {

/// The rank's CPU threads: as asked, else the node's cores shared by its ranks -- but never more
/// than this rank may run on (its affinity: a launcher that binds it to one core makes more threads
/// share it).
int thread_count(const TrainOptions& options, int local_size) {
  const int bound = runtime::available_cores();
  const int share = std::max(1, runtime::machine_cores() / std::max(1, local_size));
  const int threads = options.threads > 0 ? options.threads : std::min(share, bound);
  if (options.threads > bound) {
    log::warn(
        "--threads {}: this rank may run on {} core(s) only (its CPU affinity, set by the launcher: Open MPI "
        "binds each rank to one core when np <= 2; --bind-to none, or --map-by slot:PE={} gives it more)",
        options.threads, bound, options.threads);
  } else if (options.threads == 0 && bound < share) {
    log::info("threads: {} per rank, the cores its CPU affinity allows ({} would be this node's share)", threads,
              share);
  }
  return threads;
}

/// The process-wide settings of the run on this rank: device, math modes, threads, NVTX, host
/// memory reuse, the seed. Returns the log line of the CPU tensors' allocator ("" without
/// --malloc-reuse).
std::string configure_process(const RunSetup& setup) {
  const TrainOptions& options = setup.options;
  profile::set_nvtx_enabled(options.nvtx);
  if (options.pin_memory && !setup.device.is_cuda()) {
    log::warn("--pin-memory true has no effect on the CPU (page-locked memory is for GPU copies)");
  }
  configure_device(setup.device, options.cudnn_benchmark);
  apply_math_mode(setup.precision);
  torch::set_num_threads(setup.threads);
  // Blocks a tensor frees serve the next of their size, glibc's heap included; after the set-up, every
  // step reuses the memory the last freed (the constructor, keep_freed_memory_for_reuse).
  const std::string allocator = options.malloc_reuse ? runtime::use_malloc_aligned_cpu_allocator() : "";
  torch::manual_seed(options.seed);
  return allocator;
}

/// The model's training state once the recipe built it: the plan applied (parallelize), what the
/// optimizer trains (the shards under FSDP, those the recipe had cut at build taken as they are:
/// cut_at_build), the optimizer, loss scaling, DDP's buckets.
void set_up_training(const RunSetup& setup, TrainingState& training, UnitSharder* cut_at_build) {
  const TrainOptions& options = setup.options;
  Recipe& recipe = setup.recipe;
  training.trainable = recipe.trainable_parameters();
  for (const auto& p : training.trainable) training.trainable_numel += p.numel();
  training.parallel = parallelize(recipe.shardable_model(), setup.plan, setup.comm, cut_at_build);
  if (const FullyShardedUnits* fsdp = training.fsdp()) training.trainable = fsdp->trainable_shards();
  training.optimizer = make_optimizer(options.optim, training.trainable);
  // Under FSDP the ranks agree on a non-finite gradient shard (torch's ShardedGradScaler).
  if (setup.precision.loss_scaling) {
    training.scaler = std::make_unique<GradScaler>(GradScalerOptions{}, training.fsdp() ? &setup.comm : nullptr);
  }
  training.sync_options = options.grad_sync_options(setup.cuda_graphs.use);
  training.shared_buffers = recipe.shared_buffers();
}

/// Refuses an epoch plan in which a rank computes a micro-batch smaller than the recipe takes
/// (Recipe::min_batch_per_rank: BatchNorm's 2 at a 1 x 1 feature map). Every rank checks every rank's plan (indices
/// only, no data), so all reach the same verdict. The sizes do not depend on the epoch's shuffle.
void refuse_small_batches(const RunSetup& setup) {
  const BatchFloor floor = setup.recipe.min_batch_per_rank();
  const std::int64_t least = floor.samples;
  if (least <= 1) return;
  const TrainOptions& options = setup.options;
  for (int rank = 0; rank < setup.world_size(); ++rank) {
    data::EpochPlanOptions plan = setup.epoch_plan;
    plan.rank = rank;
    for (const auto& b : cut_plan(data::plan_epoch(plan, 0), setup.steps_per_epoch * options.grad_accum)) {
      const auto n = static_cast<std::int64_t>(b.indices.size());
      MGBENCH_REQUIRE(
          !b.compute || n >= least, ConfigError,
          "--batch-size {}: rank {} computes a batch of {} sample(s) at the end of each epoch ({} samples over {} "
          "rank(s)), and this training needs at least {} per rank ({}): give --drop-last true, or another "
          "--batch-size or --limit-train",
          options.batch_size, rank, n, setup.recipe.train_size(), setup.world_size(), least, floor.why);
    }
  }
}

/// What the planned steps leave undone, to warn of: an epoch's micro-batches that no optimizer step
/// takes (--grad-accum not dividing them, where --max-steps does not cut the epoch anyway), a
/// learning-rate warm-up longer than the run, and the recipe's own (Recipe::steps_warning).
std::vector<std::string> step_warnings(const RunSetup& setup) {
  const TrainOptions& options = setup.options;
  std::vector<std::string> warnings;
  const std::int64_t micro_batches =
      axes::strategy_info(options.strategy).computed_batches(data::epoch_shape(setup.epoch_plan));
  const std::int64_t left = micro_batches - setup.steps_per_epoch * options.grad_accum;
  if (left > 0 && (options.max_steps <= 0 || micro_batches / options.grad_accum <= options.max_steps)) {
    warnings.push_back(fmt::format(
        "--grad-accum {}: each epoch's {} micro-batches per rank make {} optimizer step(s), and its last {} are not "
        "trained on; a --grad-accum that divides {} takes them",
        options.grad_accum, micro_batches, setup.steps_per_epoch, left, micro_batches));
  }
  const std::int64_t run_steps = setup.steps_per_epoch * options.epochs;
  if (options.optim.warmup_steps >= run_steps) {
    warnings.push_back(fmt::format(
        "--warmup-steps {} at or past the run's {} optimizer steps: the learning rate never reaches --lr {} (it ends "
        "at {:.3g})",
        options.optim.warmup_steps, run_steps, options.optim.lr,
        lr_at_step(options.optim.lr, run_steps - 1, options.optim.warmup_steps, run_steps,
                   options.optim.lr_schedule == LrSchedule::kCosine)));
  }
  if (std::string recipe = setup.recipe.steps_warning(run_steps); !recipe.empty())
    warnings.push_back(std::move(recipe));
  return warnings;
}

/// The epochs' plan and the optimizer steps each holds. Throws ConfigError for an epoch without one,
/// or with a batch the recipe cannot train on (refuse_small_batches); warns (rank 0) of step_warnings.
void plan_epochs(RunSetup& setup) {
  const TrainOptions& options = setup.options;
  const Recipe& recipe = setup.recipe;
  setup.metric_count = static_cast<std::int64_t>(recipe.metric_names().size());
  setup.epoch_plan = {options.strategy,   recipe.train_size(), options.batch_size,
                      setup.world_size(), setup.rank(),        options.seed,
                      options.shuffle,    options.drop_last,   recipe.train_shard_sizes()};
  if (recipe.eval_only()) return;
  setup.steps_per_epoch =
      axes::steps_per_epoch(axes::strategy_info(options.strategy), data::epoch_shape(setup.epoch_plan),
                            options.grad_accum, options.max_steps);
  MGBENCH_REQUIRE(setup.steps_per_epoch > 0, ConfigError,
                  "{} samples over {} rank(s) at --batch-size {} x --grad-accum {} make no optimizer step",
                  recipe.train_size(), setup.world_size(), options.batch_size, options.grad_accum);
  refuse_small_batches(setup);
  if (setup.rank() != 0) return;
  for (const std::string& warning : step_warnings(setup)) log::warn("{}", warning);
}

}  // namespace

TrainingLoop::TrainingLoop(const TrainOptions& train, Recipe& recipe, runtime::Communicator& comm,
                           runtime::DevicePlacement placement, const NodeShare& node)
    : state_(std::make_unique<LoopState>(train, recipe, comm, placement)) {
  RunSetup& setup = state_->setup;
  const axes::StrategyInfo& strategy = axes::strategy_info(train.strategy);
  MGBENCH_REQUIRE(!strategy.single_process || comm.world_size() == 1, ConfigError,
                  "--strategy {} is single-process (one rank drives the GPUs): start 1 rank, not {}", strategy.name,
                  comm.world_size());
  setup.threads = thread_count(train, node.local_size);
  setup.device = to_torch_device(placement);
  setup.plan = train.parallel_plan(comm.world_size(), recipe.activation_checkpointing());
  // Before the set-up's work: --cuda-graphs on that cannot be honoured fails here, on every rank alike.
  setup.cuda_graphs =
      resolve_cuda_graphs(train.cuda_graphs, {setup.device.is_cuda(), comm.world_size(), setup.plan.fully_sharded(),
                                              strategy.single_process, recipe.graph_blocker(train)});
  const std::string allocator = configure_process(setup);
  {
    const Stopwatch clock;
    // Fully sharded: the recipe may hand its units over to be cut as it builds them.
    std::optional<UnitSharder> sharder;
    if (setup.plan.fully_sharded()) sharder.emplace(comm.rank(), comm.world_size());
    UnitSharder* cut_at_build = sharder ? &*sharder : nullptr;
    recipe.setup({setup.options, setup.device, placement, setup.precision, comm.rank(), setup.plan, cut_at_build,
                  node.host_memory, setup.cuda_graphs.use});
    set_up_training(setup, state_->training, cut_at_build);
    if (setup.cuda_graphs.use) state_->training.graphs = std::make_unique<MicroBatchGraphs>(setup.device);
    setup.setup_s = clock.elapsed();
    setup.setup_peak_memory_bytes = peak_memory_bytes(setup.device);
  }
  if (train.malloc_reuse) {
    const std::string line = host_memory::keep_freed_memory_for_reuse();
    if (comm.rank() == 0) log::info("{}; {}", line, allocator);
  }
  state_->cupti.set(make_cupti(setup.device, train.cupti, comm), profile::parse_profile_window(train.profile_window));
  if (!recipe.eval_only()) state_->energy.open(train, placement, node.local_size, comm.rank() == 0);
  plan_epochs(setup);
}

TrainingLoop::~TrainingLoop() = default;

const char* TrainingLoop::throughput_unit() const { return state_->setup.recipe.counts_tokens() ? "tok/s" : "img/s"; }

results::RankLayout TrainingLoop::layout() const {
  const RunSetup& setup = state_->setup;
  results::RankLayout l;
  if (setup.recipe.eval_only()) {
    l.epochs = 1;
    l.steps_per_epoch = 1;
    return l;
  }
  l.epochs = setup.options.epochs;
  l.steps_per_epoch = setup.steps_per_epoch;
  l.cuda_metrics = state_->cupti.collector() != nullptr;
  l.telemetry = state_->energy.enabled();
  l.metrics = setup.recipe.metric_names();
  if (setup.options.record_indices) {
    const auto plan = cut_plan(data::plan_epoch(setup.epoch_plan, 0), setup.steps_per_epoch * setup.options.grad_accum);
    for (const auto& b : plan) {
      if (b.compute) l.indices_per_epoch += static_cast<std::int64_t>(b.indices.size());
    }
  }
  return l;
}

namespace {

/// What a rank holds of the model, in bytes: parameters (the whole model, NF4 weights' packed parts
/// included; under FSDP its shards and the units gathered at the peak), gradients (of what the
/// optimizer trains, and those held beside them: gradient_bytes_per_rank) and the optimizer's
/// states; and the recipe's estimate of the activations where it has one. Buffers are not counted.
h5::Attributes memory_attributes(const LoopState& state) {
  const TrainingState& training = state.training;
  const RunSetup& setup = state.setup;
  std::int64_t parameters = 0;
  std::int64_t trained = 0;
  std::int64_t whole_gradient_peak = 0;
  if (const FullyShardedUnits* fsdp = training.fsdp()) {
    const ShardedMemory m = fsdp->memory();
    parameters = m.shard_bytes + m.gathered_peak_bytes;
    trained = m.trainable_shard_bytes;
    whole_gradient_peak = m.whole_gradient_peak_bytes;
  } else {
    for (const auto& p : setup.recipe.model().parameters()) parameters += static_cast<std::int64_t>(p.nbytes());
    for (const auto& p : training.trainable) trained += static_cast<std::int64_t>(p.nbytes());
    // Packed weights (NF4) too, as FSDP counts them.
    if (models::ShardableModel* model = setup.recipe.shardable_model()) {
      for (const UnitShape& u : unit_shapes(model->parameter_units())) parameters += u.packed_bytes;
    }
  }
  const TrainOptions& options = setup.options;
  h5::Attributes a{{"parameter_bytes_per_rank", parameters},
                   {"gradient_bytes_per_rank",
                    gradient_bytes_per_rank(setup.plan, options.gradient_as_bucket_view, trained, whole_gradient_peak)},
                   {"optimizer_state_bytes_per_rank", optimizer_states_per_element(options.optim) * trained}};
  // The recipe's estimate at this world size (`--dry-run`'s column), where it makes one.
  const std::vector<MemoryPlanRow> plan = setup.recipe.memory_plan(options, {setup.world_size()});
  if (!plan.empty() && plan.front().activation_bytes >= 0) {
    a.emplace_back("activation_bytes_per_rank", plan.front().activation_bytes);
  }
  return a;
}

/// The run attributes of the collectives a step issues, at any world size: DDP's buckets, FSDP's
/// gathers and reduce-scatters, the buffers' broadcast, the loss normaliser's all-reduce.
h5::Attributes collective_attributes(const LoopState& state) {
  const RunSetup& setup = state.setup;
  const TrainingState& training = state.training;
  const MicroBatchCollectives& fsdp = training.parallel.fsdp_collectives;
  const std::size_t buckets =
      setup.plan.replicated() ? runtime::GradSync::assign(training.trainable, training.sync_options).size() : 0;
  return {{"allreduce_buckets", static_cast<std::int64_t>(buckets)},
          {"fsdp_units", training.fsdp() ? training.fsdp()->num_units() : std::int64_t{0}},
          {"fsdp_allgather_bytes", fmt::format("{}", fmt::join(fsdp.all_gather_bytes, ","))},
          {"fsdp_reducescatter_bytes", fmt::format("{}", fmt::join(fsdp.reduce_scatter_bytes, ","))},
          // What a step broadcasts before each micro-batch and all-reduces for its loss, at any world size.
          {"buffer_broadcast_bytes",
           fmt::format("{}", fmt::join(runtime::broadcast_coalesced_bytes(training.shared_buffers), ","))},
          {"loss_allreduce_bytes",
           std::int64_t{setup.recipe.loss_normalization() == LossNormalization::kMeanPerMicroBatch ? 0 : 8}}};
}

}  // namespace

h5::Attributes TrainingLoop::run_attributes() const {
  const RunSetup& setup = state_->setup;
  h5::Attributes a{{"device", std::string(setup.device.is_cuda() ? "cuda" : "cpu")},
                   {"backend", setup.comm.backend()},
                   {"trainable_parameters", state_->training.trainable_numel},
                   {"gradient_dtype", std::string(axes::dtype_info(setup.precision.gradient_dtype()).name)},
                   {"grad_accum", setup.options.grad_accum},  // --global-batch-size's at this world size
                   {"cuda_graphs_decision", setup.cuda_graphs.text()}};
  for (auto&& attribute : collective_attributes(*state_)) a.push_back(std::move(attribute));
  // The peak MFU divides by, and where it comes from: a run's MFU is read against it.
  const runtime::PeakFlops peak = run_peak_flops(setup);
  a.emplace_back("mfu_peak_tflops", peak.flops / 1e12);
  a.emplace_back("mfu_peak_source", peak.source);
  for (auto&& attribute : memory_attributes(*state_)) a.push_back(std::move(attribute));
  for (auto&& attribute : setup.recipe.attributes()) a.push_back(std::move(attribute));
  return a;
}

h5::Attributes TrainingLoop::rank_attributes() const {
  const RunSetup& setup = state_->setup;
  h5::Attributes a{{"device", setup.device.str()},
                   {"threads", static_cast<std::int64_t>(setup.threads)},
                   {"setup_s", setup.setup_s},
                   {"setup_peak_memory_bytes", setup.setup_peak_memory_bytes}};
  h5::merge_attributes(a, session::gpu_attributes(setup.placement));
  return a;
}

void TrainingLoop::state_dict(CheckpointState& state) const {
  const TrainingState& training = state_->training;
  const std::vector<CheckpointTensor> tensors = state_->checkpoint_tensors();
  put_tensors(state, "model/", tensors, state_->setup.world_size());
  put_optimizer(state, "optimizer/", *training.optimizer, tensors, state_->setup.world_size());
  if (training.scaler) {
    state.put("scaler.scale", training.scaler->get_scale());
    state.put("scaler.growth_tracker", training.scaler->growth_tracker());
  }
  put_rng(state, state_->setup.device);
  state_->progress.save(state);
}

void TrainingLoop::load_state_dict(const CheckpointState& state) {
  TrainingState& training = state_->training;
  RunProgress& progress = state_->progress;
  const std::vector<CheckpointTensor> tensors = state_->checkpoint_tensors();
  load_tensors(state, "model/", tensors);
  load_optimizer(state, "optimizer/", *training.optimizer, tensors);
  if (training.scaler)
    training.scaler->load_state(state.number("scaler.scale"), state.integer("scaler.growth_tracker"));
  load_rng(state, state_->setup.device);
  progress.load(state);
  MGBENCH_REQUIRE(progress.epoch <= state_->setup.options.epochs, DataError,
                  "checkpoint '{}': epoch {} is outside this run's {} epochs", state.source(), progress.epoch + 1,
                  state_->setup.options.epochs);
}

// --- the run's lifecycle -------------------------------------------------------------------------

namespace {

/// DDP's start: every rank from rank 0's trained parameters and shared buffers, and the gradient
/// buckets' all-reduce hooked into backward.
void replicate(const RunSetup& setup, TrainingState& training) {
  if (training.fsdp()) return;  // each rank holds its shards; gradients are reduce-scattered by the units
  runtime::broadcast_coalesced(setup.comm, training.trainable, 0);
  if (training.shares_buffers(setup.world_size())) runtime::broadcast_coalesced(setup.comm, training.shared_buffers, 0);
  if (!setup.plan.replicated()) return;
  training.grad_sync = std::make_unique<runtime::GradSync>(training.trainable, setup.comm, training.sync_options);
  log::info("gradient sync: {} bucket(s), first {:.2f} MiB, then up to {:.1f} MiB, all-reduced {}",
            training.grad_sync->num_buckets(), setup.options.first_bucket_mb, setup.options.bucket_mb,
            training.sync_options.launch_in_backward ? "during backward" : "after backward (CUDA graphs)");
}

}  // namespace

results::RunSummary TrainingLoop::run(results::ResultsWriter& writer, Progress& progress, RunControl& control) {
  LoopState& state = *state_;
  if (state.setup.recipe.eval_only()) {
    const Stopwatch clock;
    const std::optional<EvalResult> result = evaluate(control.stop);
    if (!result) {  // stopped: marked preempted, the partial summary not written (as a training run's)
      control.preempted = true;
      results::RunSummary stopped;
      stopped.total_s = clock.elapsed();
      return stopped;
    }
    return evaluation_summary(state, *result, clock.elapsed(), writer);
  }
  // Where the run starts: a checkpoint's state (the run's clock continues), or afresh.
  RunProgress& run = state.progress;
  run = RunProgress{};
  run.summary.train_s = 0;
  run.summary.eval_s = 0;
  run.summary.checkpoint_s = 0;
  if (control.resume != nullptr) {
    load_state_dict(*control.resume);
    if (control.resume_world_size != state.setup.world_size()) {
      continue_from_world(state.setup, run, control.resume_world_size, control.resume->source());
    }
    *control.resume = CheckpointState();  // a resharded state is this rank's whole state once more
    log::info("resuming at epoch {} step {} (global step {})", run.epoch + 1, run.steps.size() + 1, run.global_step);
  }
  replicate(state.setup, state.training);
  state.energy.start(run);
  const RunSinks sinks{writer, progress, control, now_s() - run.elapsed_s, run.summary.checkpoint_s};
  state.setup.recipe.model().train();
  PhaseClock clock(state.setup.device);
  for (; run.epoch < state.setup.options.epochs; ++run.epoch) {
    EpochStage epoch(state, *this, clock, sinks);
    if (!epoch.train()) {
      run.summary.total_s = sinks.run_time(now_s(), run);  // stopped: the partial summary, not written
      return run.summary;
    }
    epoch.end();
  }
  if (state.training.graphs) log::info("{}", state.training.graphs->totals());
  return finish_run(state, *this, sinks);
}

}  // namespace mgbench::train
