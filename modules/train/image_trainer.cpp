#include "train/image_trainer.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/loader.h"
#include "data/mnist.h"
#include "data/sampler.h"
#include "data/transforms.h"
#include "models/mobilenet_v2.h"
#include "models/state_dict.h"
#include "profile/cupti_collector.h"
#include "profile/nvtx.h"
#include "profile/profile_window.h"
#include "runtime/grad_sync.h"
#include "train/data_parallel.h"
#include "train/device_pipeline.h"
#include "train/grad_scaler.h"
#include "train/lr_schedule.h"
#include "train/precision.h"

namespace mgbench::train {

std::string torch_version() { return TORCH_VERSION; }

struct ImageTrainer::State {
  ImageConfig config;
  runtime::Communicator& comm;
  int threads = 1;
  runtime::DevicePlacement placement;
  torch::Device device = torch::kCPU;
  Precision precision;
  torch::ScalarType dtype = torch::kFloat32;
  profile::ProfileWindow window;
  std::unique_ptr<profile::CuptiCollector> cupti;
  std::unique_ptr<GradScaler> scaler;
  std::unique_ptr<DataParallel> dp;  // --strategy dp
  data::MnistSplit train_set;
  data::MnistSplit test_set;
  data::EpochPlanOptions plan_options;
  models::MobileNetV2 model{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<runtime::GradSync> grad_sync;
  std::vector<torch::Tensor> synced_buffers;  // BatchNorm running statistics, shared from rank 0 each step
  bool share_buffers = false;                 // DDP's broadcast_buffers: before each forward and evaluation

  State(ImageConfig c, runtime::Communicator& comm_) : config(std::move(c)), comm(comm_) {}

  bool host_upscale() const { return config.upscale == "host"; }

  /// uint8 [B, 1, 28, 28] -> normalised, upscaled [B, 1, S, S] in the model's dtype (on the
  /// loader thread with --upscale host, on the device otherwise).
  torch::Tensor upscale(const torch::Tensor& images) const {
    return data::normalize_and_resize(images, config.image_size, dtype, data::kMnistMean, data::kMnistStd);
  }
  /// A batch's images on the device -> the model's input (layout).
  torch::Tensor to_model_input(const torch::Tensor& images) const {
    torch::Tensor x = host_upscale() ? images : upscale(images);
    return config.channels_last ? x.contiguous(torch::MemoryFormat::ChannelsLast) : x;
  }

  /// Runs the test set (each rank a contiguous shard, counts summed over ranks).
  /// Returns {correct, total} over all ranks.
  std::pair<std::int64_t, std::int64_t> evaluate();
};

ImageTrainer::ImageTrainer(ImageConfig config, runtime::Communicator& comm, int local_size,
                           runtime::DevicePlacement placement)
    : state_(std::make_unique<State>(std::move(config), comm)) {
  auto& s = *state_;
  s.config.validate();
  MGBENCH_REQUIRE(s.config.strategy != "dp" || comm.world_size() == 1, ConfigError,
                  "--strategy dp is single-process (one rank drives the GPUs): start 1 rank, not {}",
                  comm.world_size());
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  s.threads = s.config.threads > 0 ? s.config.threads : std::max(1, cores / std::max(1, local_size));
  s.placement = placement;
  s.device = to_torch_device(placement);
  s.precision = parse_precision(s.config.precision);
  s.dtype = s.precision.param_dtype;
  s.window = profile::parse_profile_window(s.config.profile_window);
  profile::set_nvtx_enabled(s.config.nvtx);
}

ImageTrainer::~ImageTrainer() = default;

void ImageTrainer::load_data() {
  auto& s = *state_;
  const auto& c = s.config;
  s.train_set = data::load_mnist(c.data_dir, data::Split::kTrain, c.limit_train);
  s.test_set = data::load_mnist(c.data_dir, data::Split::kTest, c.limit_test);
  if (c.pin_memory && !s.device.is_cuda()) {
    log::warn("--pin-memory true has no effect on the CPU (page-locked memory is for GPU copies)");
  }
  configure_device(s.device, c.cudnn_benchmark);
  apply_math_mode(s.precision);
  if (s.precision.loss_scaling) s.scaler = std::make_unique<GradScaler>();
  if (s.device.is_cuda() && c.cupti) s.cupti = profile::CuptiCollector::create();

  // dp: one process, the whole batch per step (its multi-GPU replication: see image_trainer.h).
  const std::string plan_strategy = c.strategy == "dp" ? "ddp-ds" : c.strategy;
  s.plan_options = {data::parse_strategy(plan_strategy),
                    s.train_set.size(),
                    c.batch_size,
                    s.comm.world_size(),
                    s.comm.rank(),
                    c.seed,
                    c.shuffle,
                    c.drop_last};
  torch::set_num_threads(s.threads);
  torch::manual_seed(c.seed);
  s.model = models::MobileNetV2(models::MobileNetV2Options{data::kMnistClasses, c.width_mult, c.dropout});
  s.model->set_batchnorm_frozen(c.freeze_batchnorm);
  s.model->to(s.device, s.dtype);
  if (c.channels_last) models::to_channels_last(*s.model);
  if (c.strategy == "dp") {
    // One process over every visible GPU of the node, the module on the rank's GPU first.
    std::vector<torch::Device> devices{s.device};
    if (s.device.is_cuda()) {
      for (int i = 0; i < runtime::visible_cuda_devices(); ++i) {
        if (i != s.device.index()) devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
      }
    }
    s.dp = std::make_unique<DataParallel>(s.model, devices);
    log::info("data parallel over {} device(s)", devices.size());
  }

  std::vector<torch::Tensor> params = s.model->parameters();
  if (c.optimizer == "sgd") {
    s.optimizer = std::make_unique<torch::optim::SGD>(
        params,
        torch::optim::SGDOptions(c.lr).momentum(c.momentum).weight_decay(c.weight_decay).nesterov(c.momentum > 0));
  } else {
    s.optimizer =
        std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  }
}

std::vector<torch::Tensor> ImageTrainer::parameters() const { return state_->model->parameters(); }
std::vector<torch::Tensor> ImageTrainer::buffers() const { return state_->model->buffers(); }

results::RankLayout ImageTrainer::layout() const {
  const auto& s = *state_;
  results::RankLayout l;
  l.epochs = s.config.epochs;
  l.steps_per_epoch = data::computed_batches_per_epoch(s.plan_options);
  l.cuda_metrics = s.cupti != nullptr;
  if (s.config.record_indices) {
    for (const auto& b : data::plan_epoch(s.plan_options, 0)) {
      if (b.compute) l.indices_per_epoch += static_cast<std::int64_t>(b.indices.size());
    }
  }
  return l;
}

h5::Attributes ImageTrainer::run_attributes() const {
  const auto& s = *state_;
  const auto& c = s.config;
  std::int64_t params = 0;
  for (const auto& p : s.model->parameters()) params += p.numel();
  return {{"task", std::string("image")},
          {"model", std::string("mobilenet_v2")},
          {"model_parameters", params},
          {"width_mult", c.width_mult},
          {"strategy", c.strategy},
          {"precision", c.precision},
          {"pin_memory", std::string(c.pin_memory ? "true" : "false")},
          {"image_size", c.image_size},
          {"batch_size", c.batch_size},
          {"epochs", c.epochs},
          {"seed", static_cast<std::int64_t>(c.seed)},
          {"train_samples", s.train_set.size()},
          {"test_samples", s.test_set.size()},
          {"train_images_file", s.train_set.images_path},
          {"optimizer", c.optimizer},
          {"lr", c.lr},
          {"lr_schedule", c.lr_schedule},
          {"channels_last", std::string(c.channels_last ? "true" : "false")},
          {"backend", s.comm.backend()},
          {"device", std::string(s.device.is_cuda() ? "cuda" : "cpu")},
          {"upscale", c.upscale},
          {"cudnn_benchmark", std::string(c.cudnn_benchmark ? "true" : "false")},
          {"profile_window", s.window.describe()},
          {"torch_version", torch_version()}};
}

h5::Attributes ImageTrainer::rank_attributes() const {
  const auto& s = *state_;
  h5::Attributes a{{"device", s.device.str()}, {"threads", static_cast<std::int64_t>(s.threads)}};
  if (s.device.is_cuda()) {
    a.emplace_back("gpu", runtime::cuda_device_description(s.placement.index));
    a.emplace_back("gpu_pci_bus_id", runtime::cuda_pci_bus_id(s.placement.index));
  }
  return a;
}

std::pair<std::int64_t, std::int64_t> ImageTrainer::State::evaluate() {
  torch::NoGradGuard no_grad;
  if (share_buffers) runtime::broadcast_coalesced(comm, synced_buffers, 0);  // every rank evaluates one model
  model->eval();
  const std::int64_t n = test_set.size();
  const std::int64_t world = comm.world_size();
  const std::int64_t begin = n * comm.rank() / world;
  const std::int64_t end = n * (comm.rank() + 1) / world;
  // Counted on the device: one host sync per evaluation, not per batch.
  torch::Tensor correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  for (std::int64_t start = begin; start < end; start += config.batch_size) {
    std::vector<std::int64_t> indices;
    for (std::int64_t i = start; i < std::min(end, start + config.batch_size); ++i) indices.push_back(i);
    const data::ImageBatch batch = data::assemble_batch(test_set, indices, /*pin_memory=*/false);
    const torch::Tensor x = to_model_input(host_upscale() ? upscale(batch.images).to(device) : batch.images.to(device));
    const AutocastScope autocast(precision, device.type());
    const torch::Tensor predicted = model->forward(x).argmax(1);
    correct += predicted.eq(batch.labels.to(device)).sum();
  }
  model->train();
  // On the rank's device: the NCCL backend reduces device tensors only.
  torch::Tensor counts = torch::stack({correct, torch::full({}, end - begin, correct.options())});
  comm.all_reduce(counts, runtime::ReduceOp::kSum)->wait();
  counts = counts.cpu();
  return {counts[0].item<std::int64_t>(), counts[1].item<std::int64_t>()};
}

results::RunSummary ImageTrainer::run(results::ResultsWriter& writer, Progress& progress, RunControl* control) {
  auto& s = *state_;
  const auto& c = s.config;
  const bool distributed = s.comm.world_size() > 1;
  const auto layout = this->layout();
  const std::int64_t total_steps = layout.steps_per_epoch * c.epochs;
  RunControl no_control;
  RunControl& ctl = control != nullptr ? *control : no_control;

  // Where the run stands (a resumed run: where it stopped). position = plan entries of the epoch taken.
  RunProgress run;
  run.summary.train_s = 0;
  run.summary.eval_s = 0;
  std::int64_t computed_samples = 0;           // over the run, this rank
  std::vector<std::int64_t> computed_indices;  // of the epoch in progress (--record-indices)
  auto put_state = [&](CheckpointState& state) {
    put_module(state, "model/", *s.model);
    put_optimizer(state, "optimizer", *s.optimizer);
    if (s.scaler) {
      state.put("scaler.scale", s.scaler->get_scale());
      state.put("scaler.growth_tracker", s.scaler->growth_tracker());
    }
    put_rng(state, s.device);
    state.put("computed_samples", computed_samples);
    state.put_records<std::int64_t>("records/indices", computed_indices);
  };
  if (ctl.resume != nullptr) {
    const CheckpointState& saved = *ctl.resume;
    load_module(saved, "model/", *s.model);
    load_optimizer(saved, "optimizer", *s.optimizer);
    if (s.scaler) s.scaler->load_state(saved.number("scaler.scale"), saved.integer("scaler.growth_tracker"));
    load_rng(saved, s.device);
    run.load(saved);
    computed_samples = saved.integer("computed_samples");
    computed_indices = saved.records<std::int64_t>("records/indices");
    MGBENCH_REQUIRE(run.epoch <= c.epochs, DataError, "checkpoint '{}': epoch {} is outside this run's {} epochs",
                    saved.source(), run.epoch + 1, c.epochs);
    log::info("resuming at epoch {} step {} (global step {})", run.epoch + 1, run.steps.size() + 1, run.global_step);
  }

  // DDP start-up: every rank starts from rank 0's parameters and buffers.
  runtime::broadcast_coalesced(s.comm, s.model->parameters(), 0);
  for (const auto& b : s.model->buffers()) s.synced_buffers.push_back(b);
  runtime::broadcast_coalesced(s.comm, s.synced_buffers, 0);
  if (distributed) {
    runtime::GradSyncOptions options;
    options.bucket_bytes = static_cast<std::size_t>(c.bucket_mb * 1024 * 1024);
    options.first_bucket_bytes = static_cast<std::size_t>(c.first_bucket_mb * 1024 * 1024);
    s.grad_sync = std::make_unique<runtime::GradSync>(s.model->parameters(), s.comm, options);
    log::info("gradient sync: {} bucket(s), first {:.2f} MiB, then up to {:.1f} MiB", s.grad_sync->num_buckets(),
              c.first_bucket_mb, c.bucket_mb);
  }
  s.share_buffers = distributed && !c.freeze_batchnorm && !s.synced_buffers.empty();

  results::RunSummary& summary = run.summary;
  const double run_start_s = now_s() - run.elapsed_s;  // a resumed run's clock continues
  s.model->train();
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
  for (; run.epoch < c.epochs; ++run.epoch) {
    const std::int64_t epoch = run.epoch;
    const Stopwatch epoch_clock;
    results::EpochRecord& epoch_record = run.epoch_record;
    epoch_record.epoch = static_cast<std::int32_t>(epoch);
    std::vector<results::StepRecord>& steps = run.steps;
    steps.reserve(static_cast<std::size_t>(layout.steps_per_epoch));

    // Page-locked batches only help (and only exist) for copies to a GPU.
    const bool pin = c.pin_memory && s.device.is_cuda();
    data::HostTransform host_transform;
    if (s.host_upscale()) host_transform = [&s](const torch::Tensor& images) { return s.upscale(images); };
    std::vector<data::PlannedBatch> plan = data::plan_epoch(s.plan_options, epoch);
    MGBENCH_REQUIRE(run.position <= static_cast<std::int64_t>(plan.size()), DataError,
                    "checkpoint position: {} batches taken of epoch {}, which has {}", run.position, epoch + 1,
                    plan.size());
    plan.erase(plan.begin(), plan.begin() + run.position);  // a resumed epoch: the batches not yet taken
    data::ImageLoader loader(s.train_set, std::move(plan), c.prefetch, pin, host_transform);
    DeviceFeeder feeder(loader, s.device, /*async=*/pin, /*depth=*/std::max(2, c.prefetch));
    results::PhaseTimes pending;  // time of batches loaded but not computed (ddp-rr), charged to the next step
    while (true) {
      results::StepRecord step;
      const double step_start = now_s();
      update_profile_window(step_start - run_start_s, run.global_step);
      std::optional<DeviceBatch> batch = feeder.next(clock);
      if (!batch) break;
      ++run.position;
      epoch_record.loaded_samples += batch->labels.size(0);
      if (!batch->plan.compute) {
        // ddp-rr: this rank loads and transfers the batch but another rank computes it.
        pending += clock.take();
        continue;
      }
      clock.enter(results::Phase::kTransform);
      const torch::Tensor x = s.to_model_input(batch->images);

      const double lr = lr_at_step(c.lr, run.global_step, c.warmup_steps, total_steps, c.lr_schedule == "cosine");
      for (auto& group : s.optimizer->param_groups()) group.options().set_lr(lr);
      step.lr = lr;
      s.optimizer->zero_grad(/*set_to_none=*/true);
      if (s.share_buffers) {
        clock.enter(results::Phase::kAllreduce);
        runtime::broadcast_coalesced(s.comm, s.synced_buffers, 0);
      }
      clock.enter(results::Phase::kForward);
      torch::Tensor loss;
      {
        const AutocastScope autocast(s.precision, s.device.type());
        loss = torch::nn::functional::cross_entropy(s.dp ? s.dp->forward(x) : s.model->forward(x), batch->labels);
      }
      clock.enter(results::Phase::kBackward);
      if (s.grad_sync) s.grad_sync->prepare();
      if (s.scaler) {
        step.loss_scale = s.scaler->get_scale();
        s.scaler->scale(loss).backward();
      } else {
        loss.backward();
      }
      if (s.grad_sync) {
        clock.enter(results::Phase::kAllreduce);
        s.grad_sync->finish();
      }
      clock.enter(results::Phase::kOptimizer);
      bool stepped = true;
      if (s.scaler) {
        stepped = s.scaler->step(*s.optimizer);
        s.scaler->update();
      } else {
        s.optimizer->step();
      }
      step.loss = loss.item<double>();  // the step's one host sync
      step.phases = pending;
      step.phases += clock.take();
      pending = {};
      if (s.grad_sync) {
        step.allreduce_window_s = s.grad_sync->window_s();
        epoch_record.allreduce_window_s += step.allreduce_window_s;
      }
      step.skipped = stepped ? 0 : 1;
      epoch_record.skipped_steps += step.skipped;

      step.epoch = static_cast<std::int32_t>(epoch);
      step.step = static_cast<std::int64_t>(steps.size());
      step.batch_index = batch->plan.batch_index;
      step.start_s = step_start - run_start_s;
      step.step_s = now_s() - step_start;
      step.samples = batch->labels.size(0);
      if (!std::isfinite(step.loss) && !s.scaler) {
        throw Error(fmt::format("loss became {} at epoch {} step {} (lr {}): training diverged; lower --lr", step.loss,
                                epoch + 1, step.step + 1, lr));
      }
      if (std::isfinite(step.loss)) {  // amp-fp16 steps skipped by the GradScaler have none
        run.loss_sum += step.loss;
        ++run.loss_steps;
      }
      if (s.window.contains(step.start_s, run.global_step)) window_samples += step.samples;
      epoch_record.samples += step.samples;
      if (c.record_indices) {
        computed_indices.insert(computed_indices.end(), batch->plan.indices.begin(), batch->plan.indices.end());
      }
      epoch_record.phases += step.phases;
      steps.push_back(step);
      ++run.global_step;

      const double elapsed = now_s() - run_start_s;
      progress.update(
          {static_cast<int>(epoch + 1), static_cast<int>(c.epochs), step.step + 1, layout.steps_per_epoch, step.loss,
           static_cast<double>(epoch_record.samples) / epoch_clock.elapsed(), elapsed,
           elapsed / static_cast<double>(run.global_step) * static_cast<double>(total_steps - run.global_step)});

      // Step boundary: every rank learns of a stop request at the same step.
      if (at_step_boundary(ctl, run, now_s() - run_start_s, epoch_clock.elapsed(), writer, put_state)) {
        writer.write_steps(epoch, steps);  // the epoch's steps so far; its row is written when it ends
        summary.total_s = now_s() - run_start_s;
        return summary;
      }
    }
    // ddp-rr: batches loaded after this rank's last computed one belong to the epoch, not a step.
    epoch_record.phases += pending;
    pending = {};
    epoch_record.train_s = run.epoch_elapsed_s + epoch_clock.elapsed();
    epoch_record.steps = static_cast<std::int64_t>(steps.size());
    epoch_record.loss_mean = run.loss_steps == 0 ? results::kNaN : run.loss_sum / static_cast<double>(run.loss_steps);
    epoch_record.samples_per_s = static_cast<double>(epoch_record.samples) / epoch_record.train_s;
    computed_samples += epoch_record.samples;
    summary.train_s += epoch_record.train_s;

    if ((epoch + 1) % c.eval_every == 0 || epoch + 1 == c.epochs) {
      const Stopwatch eval_clock;
      const auto [correct, total] = s.evaluate();
      epoch_record.eval_s = eval_clock.elapsed();
      epoch_record.test_correct = correct;
      epoch_record.test_samples = total;
      epoch_record.test_accuracy = static_cast<double>(correct) / static_cast<double>(std::max<std::int64_t>(total, 1));
      summary.eval_s += epoch_record.eval_s;
      summary.test_accuracy = epoch_record.test_accuracy;
    }
    writer.write_steps(epoch, steps);
    writer.write_epoch(epoch_record);
    if (c.record_indices) writer.write_indices(epoch, computed_indices);
    summary.final_loss = epoch_record.loss_mean;
    summary.epochs_completed = epoch + 1;
    progress.message(
        fmt::format("epoch {}/{}: loss {:.4f} | {:.1f} img/s per rank | train {:.1f} s{}", epoch + 1, c.epochs,
                    epoch_record.loss_mean, epoch_record.samples_per_s, epoch_record.train_s,
                    std::isfinite(epoch_record.test_accuracy)
                        ? fmt::format(" | test accuracy {:.2f} % ({}/{})", 100 * epoch_record.test_accuracy,
                                      epoch_record.test_correct, epoch_record.test_samples)
                        : std::string()));
    run.next_epoch();
    computed_indices.clear();
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

  // Global figures: samples computed by all ranks, mean final loss over ranks.
  torch::Tensor totals =
      torch::tensor({static_cast<double>(computed_samples), summary.final_loss}, torch::kFloat64).to(s.device);
  s.comm.all_reduce(totals, runtime::ReduceOp::kSum)->wait();
  totals = totals.cpu();
  summary.samples_per_s = totals[0].item<double>() / summary.train_s;
  summary.final_loss = totals[1].item<double>() / s.comm.world_size();
  summary.finished_unix_s = static_cast<double>(std::time(nullptr));
  if (s.comm.rank() == 0) writer.write_summary(summary);
  run.elapsed_s = summary.total_s;
  save_checkpoint(ctl, run, /*completed=*/true, writer, put_state);  // a later --resume finds the run done
  return summary;
}

}  // namespace mgbench::train
