#include "train/llm_tuner.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/sampler.h"
#include "data/text/sft.h"
#include "models/llama.h"
#include "models/safetensors.h"
#include "runtime/grad_sync.h"
#include "train/device_pipeline.h"
#include "train/lr_schedule.h"

namespace mgbench::train {
namespace {

namespace fs = std::filesystem;

/// Peak dense matrix throughput [FLOP/s] of a device for the dtype, for MFU; NaN when unknown.
double device_peak_flops(const runtime::DevicePlacement& p, torch::ScalarType dtype, double configured_tflops) {
  if (configured_tflops > 0) return configured_tflops * 1e12;
  if (!p.is_cuda()) return NAN;
  const std::string name = runtime::cuda_device_description(p.index);
  // H100 SXM / H200: 989 TFLOP/s bf16 dense, 67 TFLOP/s fp32 (non-tensor) per the vendor datasheets.
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) {
    return (dtype == torch::kBFloat16 ? 989.0 : 67.0) * 1e12;
  }
  return NAN;
}

/// Peak memory of this process on its device: the CUDA caching allocator's peak allocation, or the
/// peak resident set size on the CPU (getrusage), in bytes.
std::int64_t peak_memory_bytes(const torch::Device& device) {
  if (device.is_cuda()) return device_memory_peaks(device).first;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux: kilobytes
}

struct Batch {
  torch::Tensor tokens;  // int64 [B, T]
  torch::Tensor labels;  // int64 [B, T]
  std::int64_t real_tokens = 0;
  std::int64_t label_tokens = 0;  // positions with a next-token target
};

}  // namespace

struct LlmTuner::State {
  LlmConfig config;
  runtime::Communicator& comm;
  runtime::DevicePlacement placement;
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kBFloat16;
  std::unique_ptr<text::Llama3Tokenizer> tokenizer;
  std::vector<text::TokenizedSample> samples;
  models::LlamaForCausalLM model{nullptr};
  std::vector<torch::Tensor> trainable;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  std::unique_ptr<runtime::GradSync> grad_sync;
  data::EpochPlanOptions plan_options;
  std::int64_t steps_per_epoch = 0;

  State(LlmConfig c, runtime::Communicator& comm_, runtime::DevicePlacement p)
      : config(std::move(c)), comm(comm_), placement(p) {}

  Batch collate(const std::vector<std::int64_t>& indices) const {
    std::size_t length = 0;
    for (auto i : indices) length = std::max(length, samples[static_cast<std::size_t>(i)].tokens.size());
    const auto b = static_cast<std::int64_t>(indices.size());
    Batch batch;
    batch.tokens = torch::full({b, static_cast<std::int64_t>(length)}, tokenizer->pad_id(), torch::kInt64);
    batch.labels = torch::full({b, static_cast<std::int64_t>(length)}, text::kIgnoreIndex, torch::kInt64);
    auto tokens = batch.tokens.accessor<std::int64_t, 2>();
    auto labels = batch.labels.accessor<std::int64_t, 2>();
    for (std::int64_t r = 0; r < b; ++r) {
      const auto& s = samples[static_cast<std::size_t>(indices[static_cast<std::size_t>(r)])];
      for (std::size_t t = 0; t < s.tokens.size(); ++t) {
        tokens[r][static_cast<std::int64_t>(t)] = s.tokens[t];
        labels[r][static_cast<std::int64_t>(t)] = s.labels[t];
        if (t > 0 && s.labels[t] != text::kIgnoreIndex) ++batch.label_tokens;
      }
      batch.real_tokens += static_cast<std::int64_t>(s.tokens.size());
    }
    // Page-locked: the copy to the GPU (loss_sum) does not block the host (the allocator keeps the
    // pinned block until the copy has completed).
    if (config.pin_memory && device.is_cuda()) batch.tokens = batch.tokens.pin_memory();
    return batch;
  }

  /// Sum over the batch of the next-token cross-entropy (fp32). Only positions that have a target
  /// go through the output projection and the softmax: prompt and padding positions (30-85 % of
  /// the tokens in alpaca / samsum) cost nothing there, forward or backward.
  torch::Tensor loss_sum(const Batch& batch) {
    const torch::Tensor tokens = batch.tokens.to(device, /*non_blocking=*/batch.tokens.is_pinned());
    const torch::Tensor h = model->hidden_states(tokens);  // [B, T, H]
    const auto t = h.size(1);
    if (t < 2 || batch.label_tokens == 0) return (h.sum() * 0).to(torch::kFloat32);  // keeps the graph
    const torch::Tensor target = batch.labels.narrow(1, 1, t - 1).reshape({-1});     // CPU, int64
    const torch::Tensor positions = (target != text::kIgnoreIndex).nonzero().squeeze(1);
    const torch::Tensor selected =
        h.narrow(1, 0, t - 1).reshape({-1, h.size(-1)}).index_select(0, positions.to(device));
    const torch::Tensor logits = torch::nn::functional::linear(selected, model->output_weight()).to(torch::kFloat32);
    return torch::nn::functional::cross_entropy(
        logits, target.index_select(0, positions).to(device),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  }
};

LlmTuner::LlmTuner(LlmConfig config, runtime::Communicator& comm, runtime::DevicePlacement placement)
    : state_(std::make_unique<State>(std::move(config), comm, placement)) {
  auto& s = *state_;
  s.config.validate();
  s.device = to_torch_device(placement);
  s.dtype = s.config.precision == "bf16" ? torch::kBFloat16 : torch::kFloat32;
}

LlmTuner::~LlmTuner() = default;

void LlmTuner::load() {
  auto& s = *state_;
  const auto& c = s.config;
  const bool is_dir = fs::is_directory(c.model);
  if (c.pin_memory && !s.device.is_cuda()) {
    log::warn("--pin-memory true has no effect on the CPU (page-locked memory is for GPU copies)");
  }
  // The model first: a name that is neither a directory nor a preset is the error to report.
  const models::LlamaConfig model_config =
      is_dir ? models::LlamaConfig::from_hf_json((fs::path(c.model) / "config.json").string())
             : models::LlamaConfig::preset(c.model);
  MGBENCH_REQUIRE(is_dir || c.init == "random", ConfigError,
                  "--model {} is a preset (shapes, no weights): use --init random, or --model <checkpoint dir>",
                  c.model);

  // Tokenizer: given, or the checkpoint's (Meta ships original/tokenizer.model).
  std::string tokenizer_path = c.tokenizer;
  if (tokenizer_path.empty() && is_dir) {
    for (const char* rel : {"original/tokenizer.model", "tokenizer.model"}) {
      if (fs::exists(fs::path(c.model) / rel)) {
        tokenizer_path = (fs::path(c.model) / rel).string();
        break;
      }
    }
  }
  MGBENCH_REQUIRE(!tokenizer_path.empty(), ConfigError,
                  "--tokenizer: expected the Llama 3 tokenizer.model (the checkpoint '{}' has none)", c.model);
  s.tokenizer = std::make_unique<text::Llama3Tokenizer>(tokenizer_path);

  text::SftOptions options;
  options.kind = text::parse_dataset_kind(c.dataset);
  options.max_seq_len = c.max_seq_len;
  options.train_on_input = c.train_on_input;
  s.samples = text::load_sft_dataset(c.data, *s.tokenizer, options);
  if (c.limit > 0 && static_cast<std::int64_t>(s.samples.size()) > c.limit)
    s.samples.resize(static_cast<std::size_t>(c.limit));
  MGBENCH_REQUIRE(!s.samples.empty(), DataError, "dataset '{}': no rows", c.data);

  MGBENCH_REQUIRE(s.tokenizer->vocab_size() <= model_config.vocab_size, DataError,
                  "tokenizer '{}' has {} tokens but the model's vocabulary is {}: not a Llama 3 model?", tokenizer_path,
                  s.tokenizer->vocab_size(), model_config.vocab_size);
  torch::manual_seed(c.seed);
  {
    // Built directly in the run's dtype: an 8B model in bf16 needs 16 GB of host memory, not 32.
    const caffe2::TypeMeta previous = torch::get_default_dtype();
    torch::set_default_dtype(caffe2::TypeMeta::fromScalarType(s.dtype));
    try {
      s.model = models::LlamaForCausalLM(model_config);
    } catch (...) {
      torch::set_default_dtype(previous);
      throw;
    }
    torch::set_default_dtype(previous);
  }
  if (c.init == "checkpoint") s.model->load_hf_checkpoint(c.model);
  s.model->to(s.device, s.dtype);
  s.model->set_activation_checkpointing(c.activation_checkpointing);
  models::LoraOptions lora;
  lora.rank = c.lora_rank;
  lora.alpha = c.lora_alpha;
  lora.dropout = c.lora_dropout;
  lora.targets = c.lora_targets;
  s.trainable = s.model->apply_lora(lora);
  if (c.eval_only && !c.adapter.empty()) {
    s.model->load_lora_adapter((fs::path(c.adapter) / "adapter_model.safetensors").string());
  }
  s.optimizer =
      std::make_unique<torch::optim::AdamW>(s.trainable, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));

  s.plan_options = {data::Strategy::kDdpDs,
                    static_cast<std::int64_t>(s.samples.size()),
                    c.batch_size,
                    s.comm.world_size(),
                    s.comm.rank(),
                    c.seed,
                    c.shuffle,
                    /*drop_last=*/false};
  s.steps_per_epoch = data::computed_batches_per_epoch(s.plan_options) / c.grad_accum;
  if (c.max_steps > 0) s.steps_per_epoch = std::min(s.steps_per_epoch, c.max_steps);
  MGBENCH_REQUIRE(c.eval_only || s.steps_per_epoch > 0, ConfigError,
                  "{} rows over {} rank(s) at --batch-size {} x --grad-accum {} make no optimizer step",
                  s.samples.size(), s.comm.world_size(), c.batch_size, c.grad_accum);
}

std::vector<torch::Tensor> LlmTuner::adapter_parameters() const { return state_->trainable; }

double LlmTuner::step_flops(double padded_tokens, double seq_len) const {
  const auto& m = state_->model->config();
  const double matmul_params = static_cast<double>(m.num_parameters() - m.vocab_size * m.hidden_size -
                                                   (2 * m.num_hidden_layers + 1) * m.hidden_size) +
                               (m.tie_word_embeddings ? static_cast<double>(m.vocab_size * m.hidden_size) : 0.0);
  const double attention =
      6.0 * static_cast<double>(m.num_hidden_layers * m.num_attention_heads * m.head_dim) * seq_len;
  return padded_tokens * (4.0 * matmul_params + attention);
}

results::RankLayout LlmTuner::layout() const {
  results::RankLayout l;
  l.epochs = state_->config.eval_only ? 1 : state_->config.epochs;
  l.steps_per_epoch = state_->config.eval_only ? 1 : state_->steps_per_epoch;
  return l;
}

h5::Attributes LlmTuner::run_attributes() const {
  const auto& s = *state_;
  const auto& c = s.config;
  std::int64_t trainable = 0;
  for (const auto& p : s.trainable) trainable += p.numel();
  std::string targets;
  for (const auto& t : c.lora_targets) targets += (targets.empty() ? "" : ",") + t;
  return {{"task", std::string(c.eval_only ? "llm-eval" : "llm")},
          {"model", c.model},
          {"model_parameters", s.model->config().num_parameters()},
          {"trainable_parameters", trainable},
          {"init", c.init},
          {"dataset", c.dataset},
          {"pin_memory", std::string(c.pin_memory ? "true" : "false")},
          {"data_file", c.data},
          {"train_samples", static_cast<std::int64_t>(s.samples.size())},
          {"max_seq_len", c.max_seq_len},
          {"strategy", std::string("ddp-ds")},
          {"precision", c.precision},
          {"batch_size", c.batch_size},
          {"grad_accum", c.grad_accum},
          {"epochs", c.epochs},
          {"lr", c.lr},
          {"warmup_steps", c.warmup_steps},
          {"lora_rank", c.lora_rank},
          {"lora_alpha", c.lora_alpha},
          {"lora_targets", targets},
          {"seed", static_cast<std::int64_t>(c.seed)},
          {"backend", s.comm.backend()},
          {"device", std::string(s.device.is_cuda() ? "cuda" : "cpu")}};
}

h5::Attributes LlmTuner::rank_attributes() const {
  const auto& s = *state_;
  h5::Attributes a{{"device", s.device.str()}};
  if (s.device.is_cuda()) a.emplace_back("gpu", runtime::cuda_device_description(s.placement.index));
  return a;
}

double LlmTuner::evaluate() {
  auto& s = *state_;
  torch::NoGradGuard no_grad;
  s.model->eval();
  const std::int64_t n = static_cast<std::int64_t>(s.samples.size());
  const std::int64_t world = s.comm.world_size();
  const std::int64_t begin = n * s.comm.rank() / world;
  const std::int64_t end = n * (s.comm.rank() + 1) / world;
  torch::Tensor loss = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(s.device));
  std::int64_t tokens = 0;
  for (std::int64_t start = begin; start < end; start += s.config.batch_size) {
    std::vector<std::int64_t> indices;
    for (std::int64_t i = start; i < std::min(end, start + s.config.batch_size); ++i) indices.push_back(i);
    const Batch batch = s.collate(indices);
    loss += s.loss_sum(batch).to(torch::kFloat64);  // summed on the device: one host sync at the end
    tokens += batch.label_tokens;
  }
  torch::Tensor totals = torch::stack({loss, torch::full({}, static_cast<double>(tokens), loss.options())});
  s.comm.all_reduce(totals, runtime::ReduceOp::kSum)->wait();
  totals = totals.cpu();
  s.model->train();
  MGBENCH_REQUIRE(totals[1].item<double>() > 0, DataError, "dataset '{}': no label tokens to evaluate", s.config.data);
  return totals[0].item<double>() / totals[1].item<double>();
}

results::RunSummary LlmTuner::run(results::ResultsWriter& writer, Progress& progress, RunControl* control) {
  auto& s = *state_;
  const auto& c = s.config;
  const bool distributed = s.comm.world_size() > 1;
  if (c.eval_only) {
    results::RunSummary summary;
    const Stopwatch clock;
    summary.eval_loss = evaluate();
    summary.eval_s = clock.elapsed();
    summary.total_s = clock.elapsed();
    summary.train_s = 0;
    summary.final_loss = summary.eval_loss;
    summary.finished_unix_s = static_cast<double>(std::time(nullptr));
    if (s.comm.rank() == 0) writer.write_summary(summary);
    return summary;
  }
  RunControl no_control;
  RunControl& ctl = control != nullptr ? *control : no_control;
  // The trained tensors (LoRA adapters) by name: the frozen base is rebuilt from --model / --seed.
  std::vector<std::pair<std::string, torch::Tensor>> trained;
  for (const auto& p : s.model->named_parameters()) {
    if (p.value().requires_grad()) trained.emplace_back(p.key(), p.value());
  }
  // Where the run stands (a resumed run: where it stopped). position = optimizer steps of the epoch done.
  RunProgress run;
  run.summary.train_s = 0;
  double flops = 0;
  std::int64_t real_tokens_total = 0;
  auto put_state = [&](CheckpointState& state) {
    put_tensors(state, "model/", trained);
    put_optimizer(state, "optimizer", *s.optimizer);
    put_rng(state, s.device);
    state.put("flops", flops);
    state.put("real_tokens", real_tokens_total);
  };
  if (ctl.resume != nullptr) {
    const CheckpointState& saved = *ctl.resume;
    load_tensors(saved, "model/", trained);
    load_optimizer(saved, "optimizer", *s.optimizer);
    load_rng(saved, s.device);
    run.load(saved);
    flops = saved.number("flops");
    real_tokens_total = saved.integer("real_tokens");
    MGBENCH_REQUIRE(run.epoch <= c.epochs && run.position <= s.steps_per_epoch, DataError,
                    "checkpoint '{}': position epoch {} step {} is outside this run ({} epochs of {} steps)",
                    saved.source(), run.epoch + 1, run.position, c.epochs, s.steps_per_epoch);
    log::info("resuming at epoch {} step {} (global step {})", run.epoch + 1, run.position + 1, run.global_step);
  }

  runtime::broadcast_coalesced(s.comm, s.trainable, 0);  // identical adapters everywhere (A is random)
  if (distributed) s.grad_sync = std::make_unique<runtime::GradSync>(s.trainable, s.comm);
  const std::int64_t total_steps = s.steps_per_epoch * c.epochs;
  const double peak = device_peak_flops(s.placement, s.dtype, c.peak_tflops);
  PhaseClock clock(s.device);
  results::RunSummary& summary = run.summary;
  const double run_start_s = now_s() - run.elapsed_s;  // a resumed run's clock continues
  s.model->train();

  for (; run.epoch < c.epochs; ++run.epoch) {
    const std::int64_t epoch = run.epoch;
    const Stopwatch epoch_clock;
    results::EpochRecord& epoch_record = run.epoch_record;
    epoch_record.epoch = static_cast<std::int32_t>(epoch);
    std::vector<results::StepRecord>& steps = run.steps;
    const auto plan = data::plan_epoch(s.plan_options, epoch);
    while (run.position < s.steps_per_epoch) {
      const std::int64_t step_in_epoch = run.position;
      results::StepRecord step;
      const double step_start = now_s();
      const double lr = lr_at_step(c.lr, run.global_step, c.warmup_steps, total_steps, /*cosine=*/true);
      for (auto& group : s.optimizer->param_groups()) group.options().set_lr(lr);
      torch::Tensor local_loss = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(s.device));
      std::int64_t local_label_tokens = 0;
      for (std::int64_t micro = 0; micro < c.grad_accum; ++micro) {
        const auto& planned = plan[static_cast<std::size_t>(step_in_epoch * c.grad_accum + micro)];
        clock.enter(results::Phase::kData);
        const Batch batch = s.collate(planned.indices);
        clock.enter(results::Phase::kForward);
        const torch::Tensor loss = s.loss_sum(batch);
        clock.enter(results::Phase::kBackward);
        const bool last = micro + 1 == c.grad_accum;
        if (last && s.grad_sync) s.grad_sync->prepare();  // DDP's no_sync for the earlier micro-batches
        loss.backward();
        local_loss += loss.detach().to(torch::kFloat64);  // stays on the device: one host sync per step, below
        local_label_tokens += batch.label_tokens;
        step.tokens += batch.real_tokens;
        step.padded_tokens += batch.tokens.numel();
        step.samples += batch.tokens.size(0);
        flops += step_flops(static_cast<double>(batch.tokens.numel()), static_cast<double>(batch.tokens.size(1)));
      }
      clock.enter(results::Phase::kAllreduce);
      if (s.grad_sync) s.grad_sync->finish();  // mean over ranks of each rank's summed gradient
      torch::Tensor totals =
          torch::stack({local_loss, torch::full({}, static_cast<double>(local_label_tokens), local_loss.options())});
      s.comm.all_reduce(totals, runtime::ReduceOp::kSum)->wait();
      totals = totals.cpu();
      const double step_tokens = totals[1].item<double>();
      clock.enter(results::Phase::kOptimizer);
      if (step_tokens > 0) {
        // Token-weighted mean over the global batch: (mean over ranks) x world / tokens.
        const double scale = static_cast<double>(s.comm.world_size()) / step_tokens;
        torch::NoGradGuard no_grad;
        for (auto& p : s.trainable) {
          if (p.grad().defined()) p.mutable_grad().mul_(scale);
        }
        if (c.clip_grad_norm > 0) torch::nn::utils::clip_grad_norm_(s.trainable, c.clip_grad_norm);
        s.optimizer->step();
      } else {
        step.skipped = 1;  // every label masked: nothing to learn from
      }
      s.optimizer->zero_grad(/*set_to_none=*/true);
      step.loss = step_tokens > 0 ? totals[0].item<double>() / step_tokens : results::kNaN;
      step.phases = clock.take();
      step.lr = lr;
      step.epoch = static_cast<std::int32_t>(epoch);
      step.step = step_in_epoch;
      step.batch_index = step_in_epoch;
      step.start_s = step_start - run_start_s;
      step.step_s = now_s() - step_start;
      MGBENCH_REQUIRE(step.skipped != 0 || std::isfinite(step.loss), Error,
                      "loss became {} at epoch {} step {} (lr {}): training diverged", step.loss, epoch + 1,
                      step_in_epoch + 1, lr);
      if (std::isfinite(step.loss)) {
        run.loss_sum += step.loss;
        ++run.loss_steps;
      }
      epoch_record.samples += step.samples;
      epoch_record.loaded_samples += step.samples;
      epoch_record.phases += step.phases;
      real_tokens_total += step.tokens;
      steps.push_back(step);
      ++run.global_step;
      const double elapsed = now_s() - run_start_s;
      progress.update(
          {static_cast<int>(epoch + 1), static_cast<int>(c.epochs), step_in_epoch + 1, s.steps_per_epoch, step.loss,
           static_cast<double>(real_tokens_total) / elapsed, elapsed,
           elapsed / static_cast<double>(run.global_step) * static_cast<double>(total_steps - run.global_step)});

      ++run.position;
      // Step boundary: every rank learns of a stop request at the same step.
      if (at_step_boundary(ctl, run, now_s() - run_start_s, epoch_clock.elapsed(), writer, put_state)) {
        writer.write_steps(epoch, steps);  // the epoch's steps so far; its row is written when it ends
        summary.total_s = now_s() - run_start_s;
        return summary;
      }
    }
    epoch_record.train_s = run.epoch_elapsed_s + epoch_clock.elapsed();
    epoch_record.steps = static_cast<std::int64_t>(steps.size());
    epoch_record.loss_mean = run.loss_steps == 0 ? results::kNaN : run.loss_sum / static_cast<double>(run.loss_steps);
    epoch_record.samples_per_s = static_cast<double>(epoch_record.samples) / epoch_record.train_s;
    summary.train_s += epoch_record.train_s;
    writer.write_steps(epoch, steps);
    writer.write_epoch(epoch_record);
    summary.final_loss = epoch_record.loss_mean;
    summary.epochs_completed = epoch + 1;
    progress.message(fmt::format("epoch {}/{}: loss {:.4f} | {:.3f} s/it | train {:.1f} s", epoch + 1, c.epochs,
                                 epoch_record.loss_mean, epoch_record.train_s / static_cast<double>(steps.size()),
                                 epoch_record.train_s));
    run.next_epoch();
  }
  summary.total_s = now_s() - run_start_s;
  torch::Tensor totals = torch::tensor({static_cast<double>(real_tokens_total), flops}, torch::kFloat64).to(s.device);
  s.comm.all_reduce(totals, runtime::ReduceOp::kSum)->wait();
  totals = totals.cpu();
  summary.s_per_it = summary.train_s / static_cast<double>(std::max<std::int64_t>(run.global_step, 1));
  summary.tokens_per_s = totals[0].item<double>() / summary.train_s;
  summary.mfu = totals[1].item<double>() / (summary.train_s * static_cast<double>(s.comm.world_size()) * peak);
  summary.finished_unix_s = static_cast<double>(std::time(nullptr));
  summary.peak_memory_bytes = peak_memory_bytes(s.device);
  if (s.comm.rank() == 0) writer.write_summary(summary);
  run.elapsed_s = summary.total_s;
  save_checkpoint(ctl, run, /*completed=*/true, writer, put_state);  // a later --resume finds the run done
  return summary;
}

void LlmTuner::save_adapter(const std::string& dir) const {
  const auto& s = *state_;
  const auto& c = s.config;
  fs::create_directories(dir);
  models::write_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), s.model->lora_state_dict(),
                            {{"format", "pt"}});
  models::LoraOptions lora;
  lora.targets = c.lora_targets;
  const nlohmann::json config{{"peft_type", "LORA"},
                              {"task_type", "CAUSAL_LM"},
                              {"r", c.lora_rank},
                              {"lora_alpha", c.lora_alpha},
                              {"lora_dropout", c.lora_dropout},
                              {"target_modules", lora.hf_targets()},
                              {"bias", "none"},
                              {"fan_in_fan_out", false},
                              {"inference_mode", true},
                              {"base_model_name_or_path", c.model}};
  const std::string path = (fs::path(dir) / "adapter_config.json").string();
  std::ofstream out(path);
  out << config.dump(2) << "\n";
  MGBENCH_REQUIRE(out.good(), DataError, "adapter config '{}': write failed", path);
}

}  // namespace mgbench::train
