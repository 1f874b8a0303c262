#pragma once
// The mgbench results schema: record types of the tables in a results file and their HDF5
// compound types. docs/results-schema.md is the reader's documentation of the same layout;
// change both together and bump kSchemaVersion.
#include <array>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>

#include "results/hdf5.h"

namespace mgbench::results {

inline constexpr std::string_view kSchemaName = "mgbench-results";
inline constexpr std::int64_t kSchemaVersion = 15;  // docs/results-schema.md, "Version history"

/// Whether the open HDF5 file is an mgbench results file: its root attribute schema is kSchemaName
/// and it has the /runs group (the writer appends only to such a file, the readers read only such
/// files; mgbench_analysis alike).
bool is_results_file(hid_t file);

/// Run states stored in /runs/<id>/status.
inline constexpr std::string_view kStatusRunning = "running";
inline constexpr std::string_view kStatusCompleted = "completed";
inline constexpr std::string_view kStatusFailed = "failed";
inline constexpr std::string_view kStatusPreempted = "preempted";
/// The job was ended from outside the run's computation: stored by a watchdog expiry (a peer rank or
/// node lost, hung or stopped; the error holds the census), and shown by the readers for a run
/// stored as "running" whose file no job holds (its write lock is free): the job ended without
/// closing it -- killed, or its node or link lost before anything could record why.
inline constexpr std::string_view kStatusAborted = "aborted";
inline constexpr std::size_t kStatusBytes = 16;
inline constexpr std::size_t kErrorBytes = 1024;
/// The summary's nccl_transports text (fixed-length, NUL-padded).
inline constexpr std::size_t kTransportsBytes = 256;

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// Wall time [s] spent in each phase of a training step (or summed over an epoch).
struct PhaseTimes {
  double data_s = 0;              // waiting for the loader to hand over the batch
  double h2d_s = 0;               // host-to-device copy of the batch (0 on CPU)
  double buffer_broadcast_s = 0;  // DDP's broadcast_buffers: BatchNorm statistics from rank 0 before each micro-batch
  double transform_s = 0;         // on-device transforms: cast, normalise, upscale
  double forward_s = 0;           // forward pass and loss (--cuda-graphs on: a replay's forward and backward)
  double backward_s = 0;          // backward pass (including all-reduce launches from gradient hooks)
  double allreduce_s = 0;         // gradient all-reduce time not hidden behind backward (waiting on it)
  double loss_reduce_s = 0;       // a summed loss's normaliser (the step's targets) all-reduced and read by the host
  double optimizer_s = 0;         // optimizer step and zeroing gradients
};

/// The phases in table order; name + "_s" is the field name in the results file.
struct PhaseField {
  const char* name;
  double PhaseTimes::*seconds;
};
inline constexpr PhaseField kPhaseFields[] = {{"data", &PhaseTimes::data_s},
                                              {"h2d", &PhaseTimes::h2d_s},
                                              {"buffer_broadcast", &PhaseTimes::buffer_broadcast_s},
                                              {"transform", &PhaseTimes::transform_s},
                                              {"forward", &PhaseTimes::forward_s},
                                              {"backward", &PhaseTimes::backward_s},
                                              {"allreduce", &PhaseTimes::allreduce_s},
                                              {"loss_reduce", &PhaseTimes::loss_reduce_s},
                                              {"optimizer", &PhaseTimes::optimizer_s}};

/// Index of each phase in kPhaseFields.
enum class Phase : std::size_t {
  kData,
  kH2d,
  kBufferBroadcast,
  kTransform,
  kForward,
  kBackward,
  kAllreduce,
  kLossReduce,
  kOptimizer,
  kCount
};
static_assert(std::size(kPhaseFields) == static_cast<std::size_t>(Phase::kCount));

/// The phases in which a rank waits for the others (the step's collectives: the gradient
/// all-reduce, the buffers' broadcast, the loss normaliser's all-reduce); the rest is its own work.
inline bool is_collective(Phase phase) {
  return phase == Phase::kAllreduce || phase == Phase::kBufferBroadcast || phase == Phase::kLossReduce;
}
/// The seconds of times spent in those phases.
inline double collective_s(const PhaseTimes& times) {
  return times.allreduce_s + times.buffer_broadcast_s + times.loss_reduce_s;
}

inline PhaseTimes& operator+=(PhaseTimes& total, const PhaseTimes& more) {
  for (const auto& f : kPhaseFields) total.*f.seconds += more.*f.seconds;
  return total;
}

/// StepRecord::cuda_graph: what the step's micro-batches did under --cuda-graphs (train/step_graphs.h).
inline constexpr std::int8_t kGraphNotRecorded = -1;  // a run before schema 15
inline constexpr std::int8_t kGraphEager =
    0;  // none captured or replayed: every step without graphs, a shape's warm-up
inline constexpr std::int8_t kGraphCaptured = 1;  // one or more captured (the step paid a device sync and the capture)
inline constexpr std::int8_t kGraphReplayed = 2;  // every micro-batch replayed its shape's graph
inline constexpr std::int8_t kGraphMixed =
    3;  // some replayed, the others eager (a shape warming up, or beyond the bound)
inline constexpr std::int8_t kGraphKinds = 4;

/// One row of rank_<r>/steps. Unwritten rows (run killed or stopped early) keep epoch = -1.
struct StepRecord {
  std::int32_t epoch = -1;        // 0-based
  std::int64_t step = -1;         // 0-based, within the epoch
  std::int64_t batch_index = -1;  // index of the batch in the epoch's loading order
  double start_s = kNaN;          // step start, seconds since the run started
  PhaseTimes phases;
  double step_s = kNaN;              // wall time of the whole step
  double loss = kNaN;                // this rank's loss per target (image: per sample) over the step's micro-batches
  std::int64_t samples = 0;          // samples computed on in this step (all its micro-batches)
  double allreduce_window_s = kNaN;  // first bucket all-reduce start -> last end (NaN: 1 rank)
  double loss_scale = kNaN;          // GradScaler scale used in this step (NaN: no loss scaling)
  std::int8_t skipped = 0;           // 1: optimizer step skipped (non-finite gradients, amp-fp16; no loss target)
  std::int64_t tokens = 0;           // text: real (non-padding) input tokens of this rank's step; 0 otherwise
  std::int64_t padded_tokens = 0;    // text: batch x padded length, summed over the micro-batches; 0 otherwise
  double lr = kNaN;                  // learning rate used in the step
  double allgather_s = 0;            // fsdp: the step's all-gathers, each launch -> completion, summed (0: none)
  double reducescatter_s = 0;        // fsdp: the step's reduce-scatters, likewise
  std::int64_t page_faults = -1;     // minor page faults of the process in the step (all threads); -1: none
  std::int8_t cuda_graph = kGraphNotRecorded;  // the step's micro-batches and CUDA graphs: kGraphEager ... kGraphMixed
};

/// One row of rank_<r>/epochs. Unwritten rows keep epoch = -1.
struct EpochRecord {
  std::int32_t epoch = -1;          // 0-based
  std::int64_t steps = 0;           // optimizer steps this rank took
  std::int64_t samples = 0;         // samples this rank computed on
  std::int64_t loaded_samples = 0;  // samples this rank loaded (ddp-rr loads more than it computes)
  double train_s = kNaN;            // wall time of the training part of the epoch
  PhaseTimes phases;                // summed over the epoch's steps
  double loss_mean = kNaN;          // mean of the step losses
  double samples_per_s = kNaN;      // samples / train_s on this rank [img/s]
  double eval_s = kNaN;             // wall time of the test-set evaluation (NaN: not evaluated)
  std::int64_t test_correct = -1;   // correct predictions, summed over all ranks
  std::int64_t test_samples = -1;   // test samples evaluated, summed over all ranks
  double test_accuracy = kNaN;      // test_correct / test_samples, in [0, 1]
  double allreduce_window_s = 0;    // summed over the epoch's steps; overlap = 1 - allreduce_s / this
  std::int64_t skipped_steps = 0;   // optimizer steps skipped (GradScaler: non-finite gradients; no loss target)
  double eval_loss = kNaN;          // mean loss per target of the evaluation, over all ranks (NaN: none)
  double allgather_s = 0;           // summed over the epoch's steps
  double reducescatter_s = 0;       // summed over the epoch's steps
  std::int64_t skipped_images = 0;  // image files of its batches not decodable, replaced (--skip-bad-images)
};

/// rank_<r>/cuda_summary (one row): CUDA activity of the profile window, from CUPTI.
struct CudaSummaryRecord {
  double window_start_s = kNaN;  // window start, seconds since the run started
  double window_s = kNaN;        // window length [s]
  std::int64_t htod_count = 0;   // host-to-device memcpy operations
  std::int64_t htod_bytes = 0;
  double htod_s = 0;                   // device time of those copies
  std::int64_t htod_pinned_count = 0;  // of which from page-locked host memory
  std::int64_t dtoh_count = 0;
  std::int64_t dtoh_bytes = 0;
  double dtoh_s = 0;
  std::int64_t dtod_count = 0;
  std::int64_t dtod_bytes = 0;
  double dtod_s = 0;
  std::int64_t kernel_count = 0;  // all kernels
  double kernel_s = 0;            // summed kernel time (concurrent kernels counted each)
  std::int64_t nccl_kernel_count = 0;
  double nccl_kernel_s = 0;
  std::int64_t samples = 0;                // samples computed in the window
  std::int64_t peak_allocated_bytes = -1;  // caching allocator peaks over the run
  std::int64_t peak_reserved_bytes = -1;
  std::int64_t dropped_records = 0;  // CUPTI records lost (buffers full)
  // The HtoD copies by what made them (CUPTI's external correlation; the rest of htod_* made by
  // nothing mgbench labels: parameters, scalars): the training batches, the evaluation batches and
  // the MPI backend's host staging of device tensors (--backend mpi on a GPU).
  std::int64_t htod_train_count = 0;
  std::int64_t htod_train_bytes = 0;
  std::int64_t htod_eval_count = 0;
  std::int64_t htod_eval_bytes = 0;
  std::int64_t htod_staging_count = 0;
  std::int64_t htod_staging_bytes = 0;
  // The step's shape on the device (issue 47): the training steps that started in the window (what
  // kernels, launches and syncs are counted per), and the device time during which at least one
  // kernel ran -- the union of the kernels' intervals, concurrent kernels (NCCL's beside compute)
  // counted once, copies not -- so kernel_busy_s / window_s is the GPU-busy share of the step.
  // -1 / NaN in runs before version 12.
  std::int64_t steps = -1;
  double kernel_busy_s = kNaN;
  // The window's time between the training steps -- from a step's end (its host sync) to the next
  // step's start: evaluation, checkpoints, the run's end -- and what CUPTI recorded there (by its
  // start: API calls, kernels, copies), kept out of window_s, the API, kernel and copy totals and
  // the cuda_api / cuda_kernels rows (the HtoD copies by purpose above count every copy of the
  // window, the evaluation's among them). NaN / -1 before version 13, whose window held them.
  double between_steps_s = kNaN;
  std::int64_t between_steps_api_calls = -1;
  std::int64_t between_steps_kernel_count = -1;
  double between_steps_kernel_s = kNaN;
  std::int64_t between_steps_copy_count = -1;
  std::int64_t between_steps_copy_bytes = -1;
};

/// A row of rank_<r>/cuda_api: one CUDA runtime/driver API function in the window.
struct CudaApiRecord {
  char name[64] = {};  // e.g. "cudaLaunchKernel" (version suffix removed)
  std::int64_t calls = 0;
  double time_s = 0;  // host time inside the call, summed
};

/// A row of rank_<r>/cuda_kernels: one kernel (by demangled name, arguments removed) in the window.
struct CudaKernelRecord {
  char name[192] = {};
  std::int64_t count = 0;
  double time_s = 0;     // device time, summed
  std::int8_t nccl = 0;  // 1: an NCCL kernel (ncclDevKernel_* / ncclKernel_*)
};

/// The cuda_api rows `report --cuda` counts per step: the runtime's and the driver's kernel launches
/// (a CUDA graph's launch one call for all its kernels), and the host's waits for the device.
/// profile::kReportedApis records each of them, called or not.
inline constexpr const char* kLaunchApis[] = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                                              "cuLaunchKernelEx", "cudaGraphLaunch",     "cuGraphLaunch"};
inline constexpr const char* kHostWaitApis[] = {"cudaStreamSynchronize", "cudaEventSynchronize",
                                                "cudaDeviceSynchronize"};

inline constexpr std::int64_t kCudaApiRows = 32;     // fixed table sizes: created at run start
inline constexpr std::int64_t kCudaKernelRows = 48;  // (unused rows: empty name, count 0)

/// A row of rank_<r>/comm (runs of `mgbench comm`): one collective, message size and placement on
/// this rank, as nccl-tests reports them.
struct CommRecord {
  char collective[16] = {};  // all-reduce | all-gather | reduce-scatter | broadcast
  char dtype[8] = {};        // fp32 | bf16 | fp16 | fp64
  char op[8] = {};           // sum | max | min; "" for collectives without a reduction
  std::int32_t root = -1;    // broadcast's root; -1 otherwise
  std::int8_t in_place = 0;  // 1: in place (NCCL's layout)
  std::int64_t bytes = -1;   // nccl-tests' size: the whole message (all-gather: the output, reduce-scatter:
                             // the input) [bytes]; -1: row not written
  std::int64_t count = 0;    // nccl-tests' count: elements of this rank's input (reduce-scatter: output)
  std::int64_t iters = 0;    // timed iterations
  double time_s = kNaN;      // mean time of one collective on this rank [s]
  double algbw_gbs = kNaN;   // bytes / time_s [GB/s, 1e9]
  double busbw_gbs = kNaN;   // algbw x the collective's bus factor (nccl-tests PERFORMANCE.md) [GB/s]
  std::int64_t wrong = -1;   // elements of this rank's output that differ from the expected ones; -1: unchecked
};

/// rank_<r>/energy (one row, runs with --telemetry other than off): what this rank's energy source
/// measured over the training loop's span (from the first step's start to the run's end: training,
/// evaluations, checkpoints). NaN: not offered by the source; source "none": no energy counter.
struct EnergyRecord {
  char source[8] = {};         // nvml (the rank's GPU) | rapl (the node's CPU packages) | none
  double node_share = 1;       // the share of the counter this rank accounts for: 1 for its GPU, 1 / ranks
                               // on the node for the node's packages (a run's energy: sum of energy_j x share)
  double span_s = kNaN;        // time between the first and the last reading [s]
  double energy_j = kNaN;      // energy over the span [J]: the counter's difference, else power integrated
  double mean_power_w = kNaN;  // energy_j / span_s [W]
  double max_power_w = kNaN;   // the largest power reading [W]
  double mean_sm_clock_mhz = kNaN;
  double mean_mem_clock_mhz = kNaN;
  double max_temperature_c = kNaN;
  double throttled_s = kNaN;  // time with a power, thermal or hardware slowdown reason set (NVML) [s]
  std::int64_t readings = 0;  // readings taken (every --telemetry-interval)
  std::int64_t samples = 0;   // samples this rank computed during the span
  std::int64_t tokens = 0;    // real tokens this rank computed during the span (text recipes; 0 otherwise)
};

/// A row of rank_<r>/telemetry: one reading. When a run has more readings than kTelemetryRows, every
/// second row is dropped and the interval doubled, so that the rows span the whole run.
struct TelemetryRecord {
  double t_s = kNaN;       // seconds since the first reading; NaN: row not written
  double energy_j = kNaN;  // energy since the first reading [J]
  double power_w = kNaN;
  double sm_clock_mhz = kNaN;
  double mem_clock_mhz = kNaN;
  double temperature_c = kNaN;
  std::uint64_t throttle_reasons = 0;  // NVML's clocks event reasons (nvmlClocksEventReason*) bit mask
};

inline constexpr std::int64_t kTelemetryRows = 1024;

/// /runs/<id>/summary, written by rank 0 when the run ends.
struct RunSummary {
  double total_s = kNaN;        // wall time from the start of training to the end of the run, less checkpoint_s
  double train_s = kNaN;        // sum of epoch training times (rank 0)
  double eval_s = kNaN;         // sum of evaluation times (rank 0)
  double samples_per_s = kNaN;  // samples computed on by all ranks / train_s [img/s]
  double final_loss = kNaN;     // loss_mean of the last epoch, averaged over ranks
  double test_accuracy = kNaN;  // accuracy after the last evaluated epoch, in [0, 1]
  std::int64_t epochs_completed = 0;
  double finished_unix_s = kNaN;        // UTC seconds since 1970 when the run ended
  double s_per_it = kNaN;               // train_s / optimizer steps (rank 0) [s/it]
  double tokens_per_s = kNaN;           // text: real tokens of all ranks / train_s [tokens/s]; NaN otherwise
  double mfu = kNaN;                    // model FLOPs / (train_s x ranks x peak FLOP/s); NaN without FLOPs or a peak
  double eval_loss = kNaN;              // the last evaluation's mean loss per target (llm --eval-only: its result)
  std::int64_t peak_memory_bytes = -1;  // rank 0: CUDA allocator peak (GPU) or peak resident set size (CPU)
  double padded_tokens_per_s =
      kNaN;  // text: padded tokens (batch x length) of all ranks / train_s, as TorchTune counts
  // Rank 0: ATen operators dispatched in one optimizer step, nested ones included, as torch.profiler
  // counts aten:: events (train/op_counter.h; the run's second step, or its last warm-up step);
  // -1: not counted (a run of one step, files before schema 10).
  std::int64_t ops_per_step = -1;
  // NCCL runs: the transports of all ranks' connections (runtime::gather_transports), e.g.
  // "P2P/CUMEM/read x24, NET/IB/GDRDMA x8"; "" for other backends and files before schema 7.
  std::array<char, kTransportsBytes> nccl_transports{};
  // Rank 0's time writing checkpoints at step boundaries (--checkpoint-every, a stop) over the run's
  // segments [s], left out of total_s, train_s and the steps' start_s; NaN: files before schema 14.
  double checkpoint_s = kNaN;

  /// nccl_transports as a string (up to its first NUL).
  std::string transports() const {
    return {nccl_transports.data(), ::strnlen(nccl_transports.data(), kTransportsBytes)};
  }
  /// Sets nccl_transports, cut to kTransportsBytes - 1 bytes.
  void set_transports(std::string_view text);
};

/// HDF5 compound types for the records (native layout in memory, same field names on disk).
h5::Handle step_record_type();
h5::Handle epoch_record_type();
h5::Handle run_summary_type();
h5::Handle cuda_summary_type();
h5::Handle cuda_api_type();
h5::Handle cuda_kernel_type();
h5::Handle comm_record_type();
h5::Handle energy_record_type();
h5::Handle telemetry_record_type();

}  // namespace mgbench::results
