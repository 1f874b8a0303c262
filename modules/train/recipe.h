#pragma once
// A recipe: what differs between the jobs mgbench runs through its one training loop (loop.h),
// in the shape of TorchTune's recipes (recipes/lora_finetune_distributed.py: set-up, train,
// clean-up; components built from the configuration). The loop owns the run -- resume, the step
// boundary (stop agreement, checkpoints), the loader and the copies to the device, gradient
// synchronisation, accumulation, clipping, the optimizer and the learning-rate schedule,
// evaluation scheduling, step and epoch records, progress and the summary. A recipe supplies its
// options, its data and model, the loss of a micro-batch, its evaluation and its records.
//
// Adding a recipe: one .cpp file with a Recipe subclass and its factory, and one row in
// recipes/table.cpp; CMake finds the file (docs/design.md, "How to add ...").
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "axes/parallel_plan.h"
#include "core/host_memory.h"
#include "core/option_table.h"
#include "data/loader.h"
#include "models/parameter_units.h"
#include "results/hdf5.h"
#include "results/schema.h"
#include "runtime/device.h"
#include "train/checkpoint/checkpoint_state.h"
#include "train/precision.h"
#include "train/train_options.h"

namespace mgbench::train {

class UnitSharder;

/// Where a recipe runs and with what: given to Recipe::setup.
struct RecipeContext {
  const TrainOptions& train;
  torch::Device device = torch::kCPU;
  runtime::DevicePlacement placement;
  const axes::PrecisionInfo& precision;  // of --precision
  int rank = 0;
  /// How the model will be laid out over the ranks (the world size in it): the loop applies it
  /// after setup (train/parallel/parallelize.h); a recipe reads it, never re-decides it.
  const axes::ParallelPlan& plan;
  /// A fully sharded plan's shards cut while the model is built (nullptr otherwise): a recipe that
  /// builds its model a unit at a time hands each unit to it as soon as the unit exists (and reads
  /// only this rank's rows of a checkpoint), so a rank never holds the whole model; one that does
  /// not leaves it, and FSDP cuts the shards from the whole model after setup.
  UnitSharder* sharder = nullptr;
  /// This rank's share of the host memory (session::Connection::host_memory): what a plan on the
  /// CPU is measured against; bytes 0: unknown, nothing refused for it.
  host_memory::HostMemoryLimit host_memory;
  /// The loop replays CUDA graphs of the micro-batches (--cuda-graphs, train/step_graphs.h): a
  /// recipe lays its batches out so that their tensors' shapes repeat (the LLM recipes' target
  /// lists at a fixed length), as graph_blocker() promised.
  bool static_shapes = false;
};

/// How the loop turns the micro-batch losses of an optimizer step into gradients.
enum class LossNormalization {
  /// Each loss is the mean over its micro-batch; the step's gradient is the mean over its
  /// micro-batches and the ranks (PyTorch's DDP with loss / grad_accum).
  kMeanPerMicroBatch,
  /// Each loss is a sum over the batch's loss_targets; the step's gradient is divided by the targets
  /// of all its micro-batches on all ranks (TorchTune 0.6's token normalisation), so that N ranks
  /// x batch b equal 1 rank x batch N * b.
  kSumOverTargets,
};

/// A micro-batch's loss as the recipe computed it.
struct MicroBatchLoss {
  torch::Tensor loss;  // scalar with a graph: what backward runs on
  /// The recipe's per-step metrics (metric_names()) of this micro-batch, float64 [metrics] on the
  /// device, detached: the loop records their mean over the step's micro-batches. Undefined: none.
  torch::Tensor metrics;
};

/// A safetensors file of the model's tensors a recipe exports (Recipe::tensor_exports).
struct TensorExport {
  std::string path;  // its directories are made when missing
  /// Names and the model's own tensors (under FSDP they hold their values only while their unit is
  /// gathered: the writer reads them then).
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

/// What one rank holds of the model at a world size, in bytes: the run attributes
/// parameter_bytes_per_rank, gradient_bytes_per_rank and optimizer_state_bytes_per_rank a run of
/// that size records, and the recipe's estimate of one micro-batch's activations (-1: none).
struct MemoryPlanRow {
  int world_size = 1;
  bool sharded = false;  // fsdp over several ranks
  std::int64_t parameter_bytes = 0;
  std::int64_t gradient_bytes = 0;
  std::int64_t optimizer_state_bytes = 0;
  std::int64_t activation_bytes = -1;
  /// Parameters, gradients, optimizer states and the activations where estimated [bytes].
  std::int64_t total_bytes() const {
    return parameter_bytes + gradient_bytes + optimizer_state_bytes + std::max<std::int64_t>(activation_bytes, 0);
  }
};

/// A rank's gradient bytes under plan: those the optimizer trains (trained_bytes: the shards under
/// FSDP) and those held beside them at the peak -- fully sharded, the whole gradients being
/// reduce-scattered (ShardedMemory::whole_gradient_peak_bytes); replicated over ranks, DDP's
/// all-reduce buckets, a second copy of every gradient unless gradient_as_bucket_view
/// (runtime/grad_sync.h). What the run attribute gradient_bytes_per_rank and `--dry-run` count.
std::int64_t gradient_bytes_per_rank(const axes::ParallelPlan& plan, bool gradient_as_bucket_view,
                                     std::int64_t trained_bytes, std::int64_t whole_gradient_peak_bytes);

/// The fewest ranks, from `from` doubling up to 4096, whose plan (plan_at(world): one row) totals
/// at most memory_bytes; nullopt when none does.
std::optional<int> fewest_ranks_that_fit(const std::function<MemoryPlanRow(int world)>& plan_at, int from,
                                         double memory_bytes);

/// The GPU memories `--dry-run` measures a plan against [GiB]: an H100's 80 and an H200's 141.
inline constexpr double kPlannedGpuGiB[] = {80.0, 141.0};

/// The rows as `--dry-run` prints them: a heading, a line per row in GiB with the total's share of
/// each of kPlannedGpuGiB, then per GPU memory the fewest planned ranks whose total fits it.
std::vector<std::string> format_memory_plan(const std::vector<MemoryPlanRow>& rows);

/// What `mgbench predict --model` needs of a model to price its step from a step measured on another
/// model with the same recipe and options (report::ModelScaling; docs/design.md, The scaling predictor).
struct ModelStepShape {
  double flops_per_position = 0;          // forward and backward [FLOP] a position, at the sample length asked
  std::int64_t trainable_parameters = 0;  // what the optimizer updates and the gradients' all-reduce moves
  std::vector<std::int64_t> allgather_bytes, reducescatter_bytes;  // FSDP's per micro-batch (world 1: unpadded)
};

/// An evaluation's outcome over all ranks (NaN / -1: not measured by the recipe).
struct EvalResult {
  double accuracy = results::kNaN;  // fraction of correct predictions
  std::int64_t correct = -1;
  std::int64_t samples = -1;
  double loss = results::kNaN;  // mean loss per target
};

/// The fewest samples a recipe trains on per rank and micro-batch (Recipe::min_batch_per_rank).
struct BatchFloor {
  std::int64_t samples = 1;
  std::string why;  // what refuses fewer, for the error message
};

class Recipe {
 public:
  virtual ~Recipe() = default;

  // --- configuration (before any rank is set up) --------------------------------------------
  /// Declares the recipe's own options into table (its fields are the defaults).
  virtual void declare(options::OptionTable& table) = 0;
  /// Defaults that depend on another option's value (a model's learning rate and weight decay),
  /// set on the options of table not given, after parsing and before validate. Throws as
  /// OptionTable::set_defaults.
  virtual void resolve_defaults(options::OptionTable& table) const {}
  /// Rules between options, with the shared ones (supported strategies and precisions, say).
  /// Throws ConfigError naming the option.
  virtual void validate(const TrainOptions& train) const = 0;

  // --- set-up (collective-free; a failure is agreed on by all ranks) ---------------------------
  /// Reads the data, builds the model on ctx.device in ctx.precision's dtype and marks what is
  /// trained. Throws DataError naming the file for unusable inputs, ConfigError for options
  /// that do not fit the data or model.
  virtual void setup(const RecipeContext& ctx) = 0;
  /// Samples of the training set (what the sampler distributes).
  virtual std::int64_t train_size() const = 0;
  /// Samples per shard of a training set in tar shards (ddp-ds then distributes whole shards:
  /// data::shard_sampler_indices); empty: the sampler distributes samples.
  virtual std::vector<std::int64_t> train_shard_sizes() const { return {}; }
  /// The fewest samples a training micro-batch may hold on a rank, and why (BatchNorm training at a
  /// 1 x 1 feature map: 2, as PyTorch refuses one value per channel). The loop refuses, before
  /// training, an epoch plan whose last batch holds fewer (--drop-last true drops it).
  virtual BatchFloor min_batch_per_rank() const { return {}; }
  /// The host batch of plan's samples; runs on the loader thread, concurrently with forward.
  virtual data::Batch assemble(const data::PlannedBatch& plan, bool pin_memory) const = 0;
  /// The model (train / eval mode, checkpoint tensors).
  virtual torch::nn::Module& model() = 0;
  /// The parameters the optimizer trains and the ranks all-reduce, in registration order.
  virtual std::vector<torch::Tensor> trainable_parameters() = 0;
  /// What a checkpoint keeps of the model, by name ("model/<name>"): everything that changes in
  /// training (all parameters and buffers, or the adapters of a frozen base rebuilt from the options).
  virtual std::vector<std::pair<std::string, torch::Tensor>> checkpoint_tensors() = 0;
  /// The model as the run's parallel plan transforms it (its units and forward hooks: FSDP,
  /// activation checkpointing); nullptr: this recipe's model has no units.
  virtual models::ShardableModel* shardable_model() { return nullptr; }
  /// The recipe's --activation-checkpointing, for the run's parallel plan (the loop applies it to
  /// shardable_model()); false for a recipe without the option.
  virtual bool activation_checkpointing() const { return false; }
  /// Buffers every rank takes from rank 0 before each forward and evaluation (DDP's
  /// broadcast_buffers: BatchNorm statistics); empty: none.
  virtual std::vector<torch::Tensor> shared_buffers() { return {}; }

  // --- training ---------------------------------------------------------------------------------
  virtual LossNormalization loss_normalization() const = 0;
  /// What a micro-batch's loss is divided by in the step's gradient, from the batch's host fields
  /// only (so a replayed graph's is the replayed batch's): 1 for a mean, its loss_targets for a sum.
  double loss_normalizer(const data::Batch& batch) const {
    return loss_normalization() == LossNormalization::kSumOverTargets ? static_cast<double>(batch.loss_targets) : 1.0;
  }
  /// Before optimizer step global_step (0-based, counted over epochs; called on a resume too):
  /// for what a recipe switches by step (fake quantisation after N steps, say). Returns true when
  /// forward computes other ops from this step on than at the previous call: the loop then drops
  /// the CUDA graphs captured before (MicroBatchGraphs::forget). Nothing by default (false).
  virtual bool begin_step(std::int64_t global_step) { return false; }
  /// Once the epochs are planned, with the run's optimizer steps (every epoch's): a warning naming an
  /// option that so many steps leave without effect (QAT's --fake-quant-after-steps at or past the
  /// last step: a run recorded as QAT that never fake-quantises), which rank 0 logs; "" for none.
  virtual std::string steps_warning(std::int64_t optimizer_steps) const { return {}; }
  /// Device-side work on a batch just copied to the device that needs neither the model nor the step
  /// (the image recipe's --decode device: nvJPEG decoding, crops, normalisation): the DeviceFeeder runs
  /// it as it copies the batch, ahead of the step, on its copy stream where it has one (so it overlaps
  /// the compute of the steps before, as DALI's prefetching does); evaluation runs it before
  /// transform. The default keeps the batch as it is.
  virtual data::Batch prepare_on_device(data::Batch batch) { return batch; }
  /// Turns a batch on the device into the model's input (cast, normalise, upscale, memory layout):
  /// the transform phase, outside autocast. The default keeps the batch as it is.
  virtual data::Batch transform(data::Batch batch) { return batch; }
  /// The loss of one transformed micro-batch (its tensors on the device), under the loop's autocast.
  virtual MicroBatchLoss forward(const data::Batch& batch) = 0;
  /// Why this recipe's micro-batches cannot be captured as CUDA graphs (--cuda-graphs,
  /// train/step_graphs.h), or "" when they can. "" promises that forward() reads nothing of a batch
  /// on the host but its tensors' shapes and dtypes, makes no host sync, runs on the calling
  /// thread's current stream and computes the same ops every step: a graph captured on one batch
  /// then replays any batch of the same shapes. Asked before setup(), from the options (the
  /// recipe's and the loop's, `train`). The default names the recipe as not declaring it.
  virtual std::string graph_blocker(const TrainOptions& train) const {
    return "the recipe does not declare its micro-batches capturable (Recipe::graph_blocker)";
  }
  /// Model FLOPs of the micro-batch's forward and backward (for MFU); NaN when not counted.
  virtual double flops(const data::Batch& batch) const { return results::kNaN; }
  /// True when throughput counts tokens (tokens/s), false for samples (img/s).
  virtual bool counts_tokens() const { return false; }
  /// Names of the recipe's per-step metrics (rank_<r>/metrics in the results file; units in the
  /// names), in the order of MicroBatchLoss::metrics. None by default.
  virtual std::vector<std::string> metric_names() const { return {}; }

  // --- evaluation -------------------------------------------------------------------------------
  /// Samples of the evaluation set (0: the recipe does not evaluate while training).
  virtual std::int64_t eval_size() const { return 0; }
  /// The host batch of evaluation samples `indices` (on the loop's thread).
  virtual data::Batch assemble_eval(const std::vector<std::int64_t>& indices) const { return {}; }
  /// Sums a transformed batch (on the device) contributes, a float64 tensor [eval_terms()] on the device.
  virtual torch::Tensor eval_sums(const data::Batch& batch) { return {}; }
  virtual std::int64_t eval_terms() const { return 0; }
  /// The result of the sums over all ranks' shards (float64 [eval_terms()], CPU). Throws DataError
  /// when they measure nothing.
  virtual EvalResult eval_result(const torch::Tensor& sums) const { return {}; }
  /// Evaluate only (no training): the run is one evaluation of the model as set up.
  virtual bool eval_only() const { return false; }

  // --- records and the end -------------------------------------------------------------------
  /// `--dry-run`: what a rank would hold of the model at each of world_sizes ranks (none by default:
  /// not planned). Reads no data and builds no model. Throws ConfigError / DataError naming the
  /// option or file.
  virtual std::vector<MemoryPlanRow> memory_plan(const TrainOptions& train, const std::vector<int>& world_sizes) const {
    return {};
  }
  /// `mgbench predict --model`: the model's step as shapes (FLOPs a position of a sample of
  /// `padded_tokens_per_sample` padded tokens, trained parameters, FSDP's collectives); nullopt where
  /// the recipe cannot say (the image recipes). Reads no data and builds no model. Throws as memory_plan.
  virtual std::optional<ModelStepShape> model_step_shape(const TrainOptions& train,
                                                         double padded_tokens_per_sample) const {
    return std::nullopt;
  }
  /// Run attributes the recipe adds to the options' (model parameters, dataset sizes, files).
  virtual h5::Attributes attributes() const = 0;
  /// The safetensors files the recipe exports after a completed run (the trained adapters, a
  /// Hugging Face checkpoint; none by default), written by rank 0 (train/tensor_export.h): each
  /// tensor while its FSDP unit is gathered, so that a sharded model is never whole on a rank.
  /// Not after a stop.
  virtual std::vector<TensorExport> tensor_exports() const { return {}; }
  /// After a completed run, on every rank, once tensor_exports() are written: the rest of the
  /// recipe's outputs (configuration files). Not after a stop.
  virtual void finish(int rank) {}
};

/// A row of the recipe table (train/recipes/table.cpp): as nccl-tests' testColl, one row per recipe; as
/// TorchTune's recipe registry, each with its default configuration.
struct RecipeInfo {
  std::string_view name;  // --recipe
  std::string_view task;  // the command that runs it: image | llm
  std::string_view help;
  /// The recipe's defaults of the loop's options (epochs, batch size, optimizer, lr, precision,
  /// ...) as "name = value" lines, the format of --config: inputs/configs/recipes/<name>.ini, built
  /// into the binary, its first line a '#' comment saying where the values come from.
  std::string_view defaults;
  std::unique_ptr<Recipe> (*make)();
};

/// Every recipe, the first of each task its default.
std::span<const RecipeInfo> recipes();
/// The recipe `name` of task (its default when name is empty). Throws ConfigError naming
/// --recipe and the task's recipes.
const RecipeInfo& find_recipe(std::string_view task, std::string_view name);

}  // namespace mgbench::train
