#pragma once
// `mgbench predict`: how a measured workload will scale to N ranks, from what mgbench measured
// (a 1-rank run's phase times, the all-reduce of a `mgbench comm` run) -- before anyone pays for
// the GPUs. The model (docs/design.md, "The scaling predictor"), per rank and optimizer step:
//
//   steps(n)      the strategy row's steps per epoch (axes/strategy.h, what the training loop runs):
//                 ddp-ds: ceil(N / n) samples in micro-batches of b (DistributedSampler's padded
//                 shard; floor with drop_last); ddp-rr: ceil(ceil(N / b) / n) (round robin over the
//                 batches); ddp: ceil(N / b) (no split); in whole steps of grad_accum, capped by max_steps
//   compute       h2d + transform + forward + backward + optimizer + the loop's other time, as
//                 measured with 1 rank (each rank has its own device: a GPU, or --threads cores)
//   data(n)       data_s; a strategy whose ranks load every batch (ddp-rr): n x data_s and n x h2d_s
//                 (every rank loads and copies every batch, computes 1/n of them)
//   nodes(n)      ceil(n / --ranks-per-node) (all on one node without it): every collective below is
//                 priced from a comm run of n ranks on that many nodes -- inside a node and across nodes
//                 are different links
//   allreduce(n)  the gradient buckets' all-reduces one after another (the gradients' dtype: the
//                 precision row's), each costing what the comm run measured for its size and dtype at n ranks
//                 (interpolated log-log; or a stated link assumption), times (1 - overlap): the share hidden behind
//                 backward as a measured multi-rank run of the workload showed (none without one)
//   fsdp(n)       --sharding fsdp instead of the all-reduce: per micro-batch, the all-gathers and reduce-scatters
//                 the run recorded (fsdp_allgather_bytes, fsdp_reducescatter_bytes: every unit gathered before
//                 its forward and again in backward, the trained units' gradients reduce-scattered), each priced
//                 as the comm run's all-gather / reduce-scatter rows of its size at n ranks (or the link), times
//                 (1 - the share hidden behind compute a measured multi-rank FSDP run showed: its forward +
//                 backward per step beyond the base's is the exposed part; none without one); the optimizer
//                 updates 1/n of the parameters (its shards)
//   step's rest   per micro-batch, the buffers' broadcasts (BatchNorm statistics, buffer_broadcast_bytes) and
//                 per step a summed loss's normaliser all-reduce (loss_allreduce_bytes), priced as the comm
//                 run's broadcast / all-reduce of their sizes at n ranks (or the link); nothing hidden
//   epoch(n)      steps(n) x (compute + data(n) + allreduce(n) + fsdp(n) + rest(n)) x straggler spread (the measured
//                 slowest rank's time outside collectives over the ranks' mean; 1 without a multi-rank run)
//   total(n)      epochs x epoch(n) + the warm-up + evaluated epochs x eval_s / n + the measured start-up;
//                 the warm-up (the base's first step beyond its steady step: paid once by each rank,
//                 whatever its steps) is taken out of compute, which is a steady step's
// Nothing is fitted: every number is measured or a labelled assumption.
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "axes/parallel_plan.h"
#include "axes/precision.h"
#include "axes/strategy.h"
#include "core/option_table.h"
#include "report/collective_cost.h"
#include "results/reader.h"

namespace mgbench::report {

/// Gradient bucket sizes [bytes] as the GradSync assigns them, approximately (it splits at tensor
/// boundaries): first_bucket_bytes, then bucket_bytes each, the rest last.
std::vector<double> gradient_buckets(double gradient_bytes, double first_bucket_bytes, double bucket_bytes);

/// The precision row of a run's `precision` attribute. Throws ResultsError naming the run and the
/// value when this mgbench does not know it (a run of a newer mgbench, a damaged file).
const axes::PrecisionInfo& precision_of(const results::RunRecord& run);

/// The parallel plan a run ran with (axes/parallel_plan.h): its world_size, `sharding` (absent: none,
/// runs before FSDP) and `reshard_after_forward` (absent: true). Throws ResultsError naming the run
/// and the value for a sharding this mgbench does not know.
axes::ParallelPlan parallel_plan_of(const results::RunRecord& run);

/// What a 1-rank run says about its workload, per optimizer step (averages over all its steps).
struct MeasuredStep {
  double data_s = 0, h2d_s = 0, transform_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0, other_s = 0;
  /// A step's compute at 1 rank: every phase above but data.
  double compute_s() const { return h2d_s + device_compute_s(); }
  /// Of it, what ranks beside one another slow down: every phase but data and the copies.
  double device_compute_s() const { return transform_s + forward_s + backward_s + optimizer_s + other_s; }
  double eval_s = 0;     // per evaluated epoch
  double startup_s = 0;  // total_s - train_s - eval_s
  /// The warm-up every rank pays once, whatever its steps (oneDNN's primitives or cuDNN's plans, the
  /// allocator's first blocks, lazy set-up): rank 0's first step beyond the median of its next ones
  /// (RunRecord::first_step_s); taken out of the phases above, which are a steady step's.
  double warmup_s = 0;
  std::int64_t evaluated_epochs = 0;
  double gradient_bytes = 0;  // trainable parameters x the bytes of the gradients' dtype
  axes::ParallelPlan plan;    // the run's (1 rank); plan.at(n) at n ranks: FSDP's collectives or the all-reduce
  std::vector<double> allgather_bytes;      // fsdp: a micro-batch's all-gathers (fsdp_allgather_bytes)
  std::vector<double> reducescatter_bytes;  // fsdp: a micro-batch's reduce-scatters
  std::vector<double>
      buffer_broadcast_bytes;       // a micro-batch's buffer broadcasts (buffer_broadcast_bytes; none: no buffers)
  double loss_allreduce_bytes = 0;  // a step's loss normaliser all-reduce (0: a mean loss, none)
  bool cuda_graphs = false;         // the run replayed its steps as CUDA graphs (cuda_graphs_decision "on")
};
/// Throws ResultsError naming the run when it has no completed epoch, lacks the attributes (an FSDP
/// run of an mgbench before its collectives were recorded too) or has a precision this mgbench does
/// not know.
MeasuredStep measure_step(const results::RunRecord& one_rank);

/// The bytes one rank's link carries in an optimizer step's collectives at plan.world ranks: each
/// message's bytes times its nccl-tests bus factor (axes/bus_bandwidth.h, ring algorithms) -- FSDP's
/// all-gathers and reduce-scatters per micro-batch, or the gradient buckets' all-reduce once a step,
/// and the buffers' broadcast per micro-batch and the loss normaliser's all-reduce. 0 at 1 rank. What
/// 2505.22905 calls inter-GPU memory traffic, from the run's own collective accounting. `buckets`:
/// the all-reduce's gradient buckets [bytes]; `micro_batches`: per step (grad_accum).
double link_bytes_per_step(const MeasuredStep& m, const axes::ParallelPlan& plan, const std::vector<double>& buckets,
                           std::int64_t micro_batches);

struct MeasuredScaling {
  double overlap = 0;                // 0 when unmeasured
  double spread = 1;                 // 1 when unmeasured
  double contention = 1;             // 1 when unmeasured
  std::vector<std::string> sources;  // run ids used
};
/// From multi-rank runs of the workload (summed over their ranks and epochs):
/// - overlap: the share of the all-reduce window hidden behind backward, 1 - exposed / window (runs
///   under CUDA graphs, cuda_graphs_decision "on", left out: their all-reduce follows backward by
///   construction);
/// - spread: the slowest rank's own time a step over the ranks' mean, summed over the runs' steps
///   (RunRecord::step_skew): synchronous ranks end each step together, the faster ones waiting in its
///   collectives (every run);
/// - contention: their compute a step (MeasuredStep::device_compute_s: train_s less the collectives,
///   data and h2d), the first epoch less the base's warm-up, over the base's: what a rank pays for
///   ranks beside it (a node's shared caches, memory bandwidth, host threads, power) and for the
///   collectives' own work on the device that computes (on a CPU the rank's core reduces the
///   gradients inside backward; on a GPU NCCL's kernels take SMs). Runs with sharding fsdp are left
///   out (their forward and backward hold the collectives they wait for: measure_fsdp_overlap reads
///   that excess as exposed), and runs whose CUDA graphs decision differs from the base's.
/// `base`: the 1-rank run's step (measure_step). Each of the three keeps its unmeasured value where
/// no run measures it.
MeasuredScaling measure_scaling(const MeasuredStep& base, const std::vector<const results::RunRecord*>& multi_rank);

/// From multi-rank FSDP runs of the workload: the share of their all-gathers and reduce-scatters
/// (allgather_s + reducescatter_s per step: launch -> completion) hidden behind compute, 1 - exposed
/// / that, where exposed is their forward + backward per step beyond the base's (FSDP waits for a
/// gather in forward / backward); 0 without one.
double measure_fsdp_overlap(const MeasuredStep& base, const std::vector<const results::RunRecord*>& multi_rank);

/// `mgbench predict --model`: the measured run's step priced for another model of the same recipe and
/// options. What the two models' shapes give (train's Recipe::model_step_shape, which `mgbench`
/// computes and hands in: this module is LibTorch-free); docs/design.md, The scaling predictor.
struct ModelScaling {
  std::string model;                    // --model: a preset or a directory with config.json
  std::string base_model;               // the measured run's
  double compute_factor = 1;            // forward + backward FLOPs a position, the model's over the base's
  double optimizer_factor = 1;          // trained parameters, the model's over the base's
  double padded_tokens_per_sample = 0;  // the base's, at which the FLOPs are counted (attention's share)
  std::vector<double> allgather_bytes, reducescatter_bytes;   // the model's FSDP collectives a micro-batch
  std::vector<std::pair<int, double>> memory_bytes_per_rank;  // its --dry-run plan's total at each rank count
};
/// The ModelScaling of `base` (a completed 1-rank run) for model `model`, its memory planned at `ranks`.
/// Throws ConfigError / DataError / ResultsError naming the run, the option or the file.
using ModelScaler = std::function<ModelScaling(const results::RunRecord& base, const std::string& model,
                                               const std::vector<std::int64_t>& ranks)>;

/// The base's step as it would be for another model (ModelScaling): forward, backward and evaluation
/// by compute_factor, the optimizer and the gradients' bytes by optimizer_factor, FSDP's collectives the
/// model's; the data, the host-to-device copies, the transform, the loop's other time, the warm-up and
/// the start-up as measured.
MeasuredStep rescaled(MeasuredStep m, const ModelScaling& model);

struct Prediction {
  const results::RunRecord* base = nullptr;  // the 1-rank run measured
  const axes::StrategyInfo* strategy = nullptr;
  int ranks = 1;
  int nodes = 1;                                      // the nodes the ranks spread over
  std::int64_t steps = 0;                             // per epoch per rank
  double compute_s = 0, data_s = 0, allreduce_s = 0;  // per step (allreduce: exposed)
  double allgather_s = 0, reducescatter_s = 0;        // per step, exposed (fsdp; 0 otherwise)
  double buffer_broadcast_s = 0, loss_reduce_s = 0;   // per step (none hidden)
  double fsdp_overlap = 0;                            // the share of FSDP's collectives hidden (measured)
  double link_bytes = 0;  // per step: what one rank's link carries in the step's collectives (bus bytes)
  double epoch_s = 0, eval_s = 0, total_s = 0;  // eval_s: per evaluated epoch
  double warmup_s = 0;                          // once per run (MeasuredStep::warmup_s)
  std::int64_t evaluated_epochs = 0;            // of the measured run
  double speedup = 1;                           // T(1 rank) / T(n ranks), both predicted
  std::string limiting;                         // the largest per-step phase
  std::string comm_source;                      // comm run or link assumption used
  MeasuredScaling scaling;
  std::optional<ModelScaling> model;  // --model: the step rescaled to that model; none: the base's own
};

/// Predicts the workload of `base` (a completed 1-rank run) at each of ranks x strategies, n ranks
/// on ceil(n / ranks_per_node) nodes (ranks_per_node 0: one node). costs: per collective, world size
/// and node count (a placement without the collectives the base needs uses `link`, or is skipped
/// with a note when none). multi_rank: the workload's measured multi-rank runs, which the overlap,
/// spread, contention and FSDP's hidden share are measured from (measure_scaling) -- for each
/// placement, those of the same strategy when there are, and never a run of the placement predicted
/// (its rank and node count): a prediction does not learn from the run the report compares it with.
/// notes: what was skipped or assumed, one line each. model: the step rescaled to another model
/// (rescaled); nullptr: the base's own.
std::vector<Prediction> predict(const results::RunRecord& base,
                                const std::vector<const results::RunRecord*>& multi_rank, const CommCosts& costs,
                                const LinkAssumption* link, const std::vector<std::int64_t>& ranks,
                                std::int64_t ranks_per_node, const std::vector<axes::Strategy>& strategies,
                                std::vector<std::string>& notes, const ModelScaling* model = nullptr);
/// The predictions point at base: not a temporary.
std::vector<Prediction> predict(results::RunRecord&& base, const std::vector<const results::RunRecord*>& multi_rank,
                                const CommCosts& costs, const LinkAssumption* link,
                                const std::vector<std::int64_t>& ranks, std::int64_t ranks_per_node,
                                const std::vector<axes::Strategy>& strategies, std::vector<std::string>& notes,
                                const ModelScaling* model = nullptr) = delete;

/// What `mgbench predict` predicts from which files (its options; declared into its option table).
struct PredictOptions {
  /// --help's text above the options.
  static constexpr const char* kUsage =
      "mgbench predict: time per epoch and per run, speed-up and the limiting phase of measured workloads at other "
      "rank counts and strategies, from each workload's completed 1-rank run and the all-reduce (--sharding fsdp: "
      "all-gather and reduce-scatter) of a `mgbench comm` run at each rank count (model: docs/design.md, The scaling "
      "predictor). Prints the predictions and appends "
      "them to --results as runs of task `prediction`; `mgbench report` then shows each beside its measured run.\n"
      "usage: mgbench predict FILE|DIR|'PATTERN'... [--comm FILE]... [--ranks 1,2,4] [--ranks-per-node 4] "
      "[--link h100-nvlink]";

  std::vector<std::string> files;       // results files, directories, quoted patterns (positional)
  std::vector<std::string> comm_files;  // more files with comm runs (--comm, repeatable)
  std::vector<std::int64_t> ranks{1, 2, 3, 4};
  std::int64_t ranks_per_node = 0;  // 0: every rank count on one node
  std::vector<axes::Strategy> strategies{axes::Strategy::kDdp, axes::Strategy::kDdpRr, axes::Strategy::kDdpDs};
  std::string link;   // a link_assumptions() name where no comm run was measured; "": none
  std::string model;  // --model: LLM runs priced for this model (ModelScaling); "": each run's own
  std::string results = "outputs/results.h5";

  void declare(options::OptionTable& table);
};

/// Every workload's predictions, each predicted from its completed 1-rank run of the strategy
/// (else of any strategy: at 1 rank they compute the same) of median time among repeats
/// (median_run, reference.h), with what was skipped or assumed.
struct PredictionPlan {
  std::vector<std::vector<Prediction>> workloads;  // one entry per workload, in the files' order
  std::vector<std::string> notes;                  // sorted, unique
  const LinkAssumption* link = nullptr;            // --link, if given
};

/// Predicts every workload of `runs` (training runs completed at 1 rank; the comm runs among
/// `runs` price the all-reduce in the gradients' dtype). A workload that cannot be predicted (a run
/// of an older mgbench) becomes a note. Throws ResultsError when no run can serve as a base.
/// With --model, each workload's base rescaled by scaler (none: --model refused).
PredictionPlan plan_predictions(const std::vector<results::RunRecord>& runs, const PredictOptions& options,
                                const ModelScaler& scaler = {});
/// The plan points into runs: not a temporary.
PredictionPlan plan_predictions(std::vector<results::RunRecord>&& runs, const PredictOptions& options,
                                const ModelScaler& scaler = {}) = delete;

/// The plan as tables (print_predictions per workload), then the notes and the link assumption.
void print_plan(std::ostream& out, const PredictionPlan& plan);

/// Appends every prediction to the results file `path` as a run of task `prediction` (its
/// attributes: the base's, then what was predicted from what; its summary: the predicted times),
/// named predicted-<strategy>-<n>r-of-<base run>. A single process: MPI must be initialised.
/// Throws what the results writer throws (ResultsError naming the file).
void write_predictions(const std::string& path, const PredictionPlan& plan, const std::string& command_line);

/// The predictions as a table ('#' header and units rows, as the report's), one row per rank count
/// and strategy, with the inputs as '#' lines.
void print_predictions(std::ostream& out, const std::vector<Prediction>& predictions);

/// `mgbench report`: predicted runs (task `prediction`) beside the measured run of the same workload,
/// strategy and rank count when there is one, with the error of the predicted total time.
void print_prediction_check(std::ostream& out, const std::vector<results::RunRecord>& runs, bool csv);

/// True for runs written by `mgbench predict`.
bool is_prediction_run(const results::RunRecord& run);

}  // namespace mgbench::report
