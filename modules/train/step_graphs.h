#pragma once
// CUDA graphs of the training step's micro-batches (--cuda-graphs; issue 47, item 4). A GPU step
// whose host cannot launch its kernels as fast as the GPU runs them (an LLM's thousands of small
// ops a step, a small image model) measures the host, not the GPU: a graph launches a micro-batch's
// whole forward and backward -- thousands of kernels -- with one call. What is captured: one
// micro-batch's forward (the recipe's loss under autocast) and backward (the loss scaled under
// amp-fp16), the gradients added into the parameters' .grad in place; what is not: the data's copy
// into the graph's static inputs (before each replay), the loss and metrics' sums (after), the
// optimizer, clipping and the scaler's update (one fused kernel each already, and their step count
// and learning rate change every step), and anything of another rank. Under DDP (several ranks,
// --sharding none) each rank captures and replays its own micro-batches and the gradients'
// all-reduce runs after the step's last micro-batch, outside the graphs: GradSync without hooks
// (runtime/grad_sync.h, launch_in_backward false), since a replay runs no host code. Nothing of
// another rank is then inside a graph: the MPI backend (which cannot be captured) works as NCCL
// does, and ranks whose batches differ in shape (padded lengths) capture at different steps. The
// cost: backward no longer overlaps the all-reduce. FSDP is refused: its units' all-gathers and
// reduce-scatters are issued by hooks inside forward and backward. A shape's first micro-batches
// run eagerly (cuDNN's autotuning, lazy initialisation and the gradients' first allocation happen
// outside a capture, as torch.cuda.graph asks), the next is captured on a side stream and
// replayed, every later one of that shape replays. Graphs share one memory pool (one shape's
// activations at a time). torch.cuda.graph / torch.cuda.make_graphed_callables are the model;
// at::cuda::CUDAGraph does the capture.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include <torch/torch.h>

#include "data/loader.h"
#include "results/schema.h"
#include "train/recipe.h"
#include "train/train_options.h"

namespace mgbench::train {

/// What decides whether a run's micro-batches can be captured (resolve_cuda_graphs).
struct GraphFacts {
  bool cuda = false;            // the rank computes on a CUDA device
  int world_size = 1;           // ranks of the run
  bool fully_sharded = false;   // --sharding fsdp over several ranks (axes::ParallelPlan::fully_sharded)
  bool single_process = false;  // --strategy dp: one process drives every GPU, replicas on threads
  std::string recipe_blocker;   // Recipe::graph_blocker(train): "" when its micro-batches can be captured
};

/// Whether the run uses graphs, and why not where it does not (the run attribute
/// cuda_graphs_decision: "on", or "off: <why>").
struct GraphDecision {
  bool use = false;
  std::string why_not;  // "" when used
  std::string text() const { return use ? "on" : "off: " + why_not; }
};

/// --cuda-graphs against the run's facts: off -> not used; on -> used, or ConfigError naming
/// --cuda-graphs and what prevents it (a CPU rank, FSDP over several ranks, --strategy dp, the
/// recipe's blocker); auto ->
/// not used, with the reason (not yet measured on a GPU: graphs are asked for with on until a GPU
/// run has compared them with the eager step -- docs/design.md, CUDA graphs).
GraphDecision resolve_cuda_graphs(CudaGraphs mode, const GraphFacts& facts);

/// The shapes, dtypes, memory layouts and devices of a batch's tensors as one key, e.g.
/// "cuda:0 Float [32, 1, 224, 224] cl; cuda:0 Long [32]": micro-batches of one key replay one graph.
std::string shape_key(const data::Batch& batch);

/// What a micro-batch does (GraphSchedule::next).
enum class GraphAction {
  kEager,    ///< run as it is: a shape's warm-up, or a shape beyond the graph bound
  kCapture,  ///< captured as its shape's graph, then replayed
  kReplay,   ///< its shape's graph replayed on it
};

/// Which micro-batches run eagerly, are captured or replay, by their shape key: a shape's first
/// `warmup` micro-batches run eagerly, its next is captured, every later one replays; once
/// `max_graphs` shapes have a graph, the micro-batches of every other shape run eagerly (a run
/// whose shapes never repeat stays eager, each shape forgotten). No CUDA: tested on the CPU.
/// Throws std::invalid_argument for warmup < 1 or max_graphs < 1.
class GraphSchedule {
 public:
  GraphSchedule(int warmup, int max_graphs);
  GraphAction next(const std::string& key);
  /// Every shape forgotten, with its graph (forward changed): each warms up and is captured again,
  /// within the bound afresh. The totals go on counting.
  void forget();
  /// Micro-batches so far by what they did; graphs() captures made (a shape captured again counts again);
  /// beyond_bound() those of eager() that ran eagerly only because max_graphs shapes held a graph.
  std::int64_t eager() const { return eager_; }
  std::int64_t beyond_bound() const { return beyond_bound_; }
  int max_graphs() const { return max_graphs_; }
  std::int64_t replays() const { return replays_; }
  std::int64_t graphs() const { return graphs_; }

 private:
  struct Shape {
    std::int64_t eager = 0;  // its micro-batches run eagerly so far
    bool captured = false;
  };
  int warmup_, max_graphs_;
  std::map<std::string, Shape, std::less<>> shapes_;  // the shapes seen while a graph was left
  int live_ = 0;                                      // shapes with a graph now (the bound's count)
  std::int64_t eager_ = 0, replays_ = 0, graphs_ = 0, beyond_bound_ = 0;
};

/// The step's results::StepRecord::cuda_graph: of its `micro_batches`, `captured` were captured and
/// `replayed` computed by a graph (the captured ones included, as GraphSchedule::replays counts) --
/// kGraphCaptured when any was captured (the step paid the capture), else kGraphReplayed when all
/// were replayed, kGraphEager when none was, kGraphMixed otherwise. Without graphs: kGraphEager.
std::int8_t graph_use(std::int64_t micro_batches, std::int64_t captured, std::int64_t replayed);

/// A micro-batch's forward and backward as the step runs it (step.cpp), returning its loss and
/// metrics detached. capturing: inside a capture, where nothing may wait on the host or record the
/// phase clock's events.
using MicroBatchWork = std::function<MicroBatchLoss(const data::Batch& input, bool capturing)>;

/// The graphs of one run's micro-batches on one CUDA device (GraphSchedule's warm-up and bound).
class MicroBatchGraphs {
 public:
  /// Throws ConfigError on a build without CUDA.
  MicroBatchGraphs(const torch::Device& device, int warmup = kWarmup, int max_graphs = kMaxGraphs);
  ~MicroBatchGraphs();
  MicroBatchGraphs(const MicroBatchGraphs&) = delete;
  MicroBatchGraphs& operator=(const MicroBatchGraphs&) = delete;

  /// input's forward and backward: work(input, false) eagerly, or its shape's graph captured from
  /// work(static inputs, true) and replayed, or replayed, ordered with the current stream. A replay's
  /// loss and metrics are copies of the graph's static outputs, made on the current stream (the
  /// next replay overwrites the outputs); the normaliser is left to the caller (Recipe::loss_normalizer of
  /// input: the host's, not the captured batch's). Throws std::runtime_error naming
  /// the shape and --cuda-graphs when a capture fails, and what work throws.
  MicroBatchLoss run(const data::Batch& input, const MicroBatchWork& work);
  /// Drops every graph (GraphSchedule::forget): the recipe's forward changed (Recipe::begin_step),
  /// so each shape is captured again after its warm-up. Waits for the device first (a graph may
  /// still be replaying).
  void forget();
  /// "cuda graphs: S capture(s), R micro-batch(es) replayed, E run eagerly (B beyond the bound of N
  /// graphs)" (the run's log).
  std::string totals() const;
  /// The micro-batches replayed so far, those captured included (each computed by its graph's first
  /// replay), and the captures so far: what a step adds to each is its graph_use.
  std::int64_t replays() const { return schedule_.replays(); }
  std::int64_t captures() const { return schedule_.graphs(); }

  static constexpr int kWarmup = 2;      // eager micro-batches of a shape before its capture
  static constexpr int kMaxGraphs = 16;  // shapes with a graph at most (their memory is one pool)

 private:
  struct Impl;
  GraphSchedule schedule_;
  bool warned_beyond_bound_ = false;  // the first micro-batch beyond the bound is named in a warning
  std::unique_ptr<Impl> impl_;
};

}  // namespace mgbench::train
