#include "train/train_options.h"

#include <algorithm>

#include "core/error.h"
#include "profile/profile_window.h"
#include "runtime/device.h"
#include "session/session.h"

namespace mgbench::train {

namespace {

constexpr options::Choice<CudaGraphs> kCudaGraphs[] = {
    {"auto", CudaGraphs::kAuto,
     "eager for now: graphs are used where asked for, until a GPU run has compared them with the eager step"},
    {"on", CudaGraphs::kOn,
     "each micro-batch shape's forward and backward captured once and replayed (GPU ranks: one, or several under "
     "DDP, the all-reduce then after backward; not FSDP; a recipe whose micro-batches allow it; an error otherwise)"},
    {"off", CudaGraphs::kOff, "every micro-batch run eagerly, op by op"},
};

bool valid_profile_window(const std::string& text) {
  try {
    profile::parse_profile_window(text);
    return true;
  } catch (const ConfigError&) {
    return false;
  }
}

}  // namespace

std::span<const options::Choice<CudaGraphs>> cuda_graph_choices() { return kCudaGraphs; }

// The bounds of the bucket sizes [MiB]: at least one byte (smaller sizes are not sizes: 1e-300 MiB
// failed in training, not here), at most 1 TiB (past any model's gradients; the byte count fits size_t).
constexpr double kOneByteMiB = 1.0 / (1024.0 * 1024.0);
constexpr double kOneTiBInMiB = 1024.0 * 1024.0;

void TrainOptions::declare_optimisation(options::OptionTable& t) {
  t.section("Optimisation");
  optim.declare(t);
  // DDP's buckets: FSDP reduce-scatters each unit's gradients instead, and has none.
  const auto replicated = [this] { return sharding != axes::Sharding::kFsdp; };
  constexpr const char* kWithBuckets = "--sharding none (FSDP reduce-scatters per unit: no buckets)";
  t.add("bucket-mb", bucket_mb, "gradient all-reduce bucket size [MiB] (DDP's bucket_cap_mb)")
      .at_least(kOneByteMiB)
      .at_most(kOneTiBInMiB)
      .same_workload()
      .only_with(replicated, kWithBuckets);
  t.add("first-bucket-mb", first_bucket_mb, "first bucket's size [MiB] (small, so communication starts early)")
      .at_least(kOneByteMiB)
      .at_most(kOneTiBInMiB)
      .same_workload()
      .only_with(replicated, kWithBuckets);
  t.add("gradient-as-bucket-view", gradient_as_bucket_view,
        "gradients held as views of the all-reduce buckets, once, not beside them (DDP's gradient_as_bucket_view)")
      .same_workload()
      .only_with(replicated, kWithBuckets);
}

void TrainOptions::declare_profiling(options::OptionTable& t) {
  t.section("Profiling (GPU runs)");
  t.add("profile-window", profile_window,
        "when CUPTI collects: START:DURATION [s] (the paper: 0:720), "
        "steps:FIRST:COUNT, or all")
      .check(valid_profile_window, "START:DURATION, steps:FIRST:COUNT or all")
      .no_effect()
      .only_with([this] { return cupti; }, "--cupti true");
  // Not .no_effect(): the CUDA tables are part of a run's layout, and collecting costs time.
  t.add("cupti", cupti, "CUDA memcpy / API / kernel totals per rank into the results file");
  t.add("nvtx", nvtx, "NVTX ranges around the phases (Nsight Systems)").no_effect();

  t.section("Energy");
  // Not in the workload: reading a counter does not change the work. But a checkpoint's run has its
  // tables (a resume must ask for the same), so it is part of the checkpoint identity.
  t.add("telemetry", telemetry, profile::telemetry_choices(),
        "energy, power, clocks, temperature and throttling per rank into the results file (J/sample)")
      .same_workload();
  t.add("telemetry-interval", telemetry_interval_ms, "milliseconds between two readings of the energy counters [ms]")
      .at_least(10)
      .at_most(60000)
      .no_effect()
      .only_with([this] { return telemetry != profile::TelemetryRequest::kOff; }, "--telemetry auto, nvml or rapl");
}

void TrainOptions::declare(options::OptionTable& t) {
  t.section("Workload distribution");
  t.add("strategy", strategy, axes::strategy_choices(), "how the ranks share the dataset (Lawenda et al. 2025, 3.2)")
      .same_workload();
  t.add("epochs", epochs, "training epochs").at_least(1);
  t.add("batch-size", batch_size, "samples per micro-batch per rank").at_least(1);
  t.add("grad-accum", grad_accum, "micro-batches per optimizer step (gradient accumulation)").at_least(1);
  // Not in the workload identity: the run attribute grad_accum holds the micro-batches it resolves to.
  t.add("global-batch-size", global_batch_size,
        "samples per optimizer step over all ranks (torchtitan's global_batch_size; 0: --grad-accum's): micro-batches "
        "per step = this / (--batch-size x ranks), so a checkpoint resumes at other rank counts with the same steps")
      .at_least(0)
      .same_workload();
  t.add("max-steps", max_steps, "optimizer steps per epoch (0: the whole epoch)").at_least(0);
  t.add("shuffle", shuffle, "reshuffle every epoch (seed + epoch)").same_workload();
  t.add("drop-last", drop_last, "drop the last incomplete batch");
  t.add("seed", seed, "seed of the weights, dropout and shuffling").same_workload();
  t.add("sharding", sharding, axes::sharding_choices(), "how the ranks hold the model (one rank: the same as none)");
  t.add("reshard-after-forward", reshard_after_forward,
        "fsdp: free each unit's gathered parameters after its forward and gather them again for backward "
        "(false: keep them to the end of backward; more memory, one all-gather less per unit)")
      .same_workload()
      .only_with([this] { return sharding == axes::Sharding::kFsdp; }, "--sharding fsdp");

  t.section("Compute");
  t.add("device", device, runtime::device_choices(), "where each rank computes");
  t.add("backend", backend, runtime::backend_choices(), "the gradient all-reduce's communication library")
      .same_workload();
  t.add("precision", precision, axes::precision_choices(), "numeric precision (axes/precision.h)");
  t.add("pin-memory", pin_memory, "page-locked host batches, copied on a copy stream ahead of compute (GPU only)");
  t.add("prefetch", prefetch,
        "batches the loader thread assembles ahead; with --pin-memory on a GPU also the batches (at least 2) the "
        "feeder thread copies, and decodes with --decode device, ahead of the step")
      .at_least(1)
      .at_most(64)
      .same_workload();
  // More threads than the machine has cores only oversubscribe them (100000 of them took 7 GB
  // before doing anything); the rank's own CPU affinity is checked when it starts (the loop).
  t.add("threads", threads,
        "intra-op CPU threads per rank (0: the cores this rank may run on, at most the node's cores / ranks on the "
        "node)")
      .at_least(0)
      .at_most(runtime::machine_cores())
      .same_workload();
  t.add("cudnn-benchmark", cudnn_benchmark, "let cuDNN time and pick convolution algorithms (GPU)").same_workload();
  // Not in the workload: a replay launches the kernels the eager step does. Its time is the point.
  t.add("cuda-graphs", cuda_graphs, cuda_graph_choices(),
        "capture a GPU micro-batch's forward and backward as a CUDA graph per shape and replay it")
      .same_workload();
  t.add("malloc-reuse", malloc_reuse,
        "keep host memory freed by a step for the next (glibc malloc: mmap threshold 32 MiB after the set-up, no "
        "trimming, and CPU tensors from malloc aligned inside the block, as glibc's memalign does not reuse a freed "
        "block for the next of its size; TCMalloc, a build's MGBENCH_MALLOC=tcmalloc: the set-up's free pages "
        "released, then release rate 0); GLIBC_TUNABLES or a preloaded jemalloc take precedence over the "
        "thresholds; false: the allocators' defaults")
      .no_effect();
  session::declare_comm_timeout(t, comm_timeout_s);
  t.add("peak-tflops", peak_tflops,
        "device peak TFLOP/s for MFU (0: the datasheet value of the GPU model, runtime/peak_flops.cpp)")
      .at_least(0)
      .same_workload();

  declare_optimisation(t);
  t.section("Evaluation and results");
  t.add("eval-every", eval_every, "evaluate every N epochs (and after the last)").at_least(1);
  session::declare_results(t, results, run_name);
  t.add("repeat", repeat,
        "run the job this many times, one after another, each a run of its own (run name suffix -r0, -r1, ...): "
        "`mgbench report` shows their spread")
      .at_least(1)
      .at_most(1000)
      .no_effect();
  t.add("warmup-steps-excluded", warmup_steps_excluded,
        "leave the first K optimizer steps (the warm-up: allocator, caches, cuDNN autotuning) out of the summary's "
        "throughput, s/it and MFU; the per-step and per-epoch records keep them")
      .at_least(0)
      .no_effect();
  t.add("record-indices", record_indices, "store the sample indices each rank computed on, per epoch")
      .as_switch()
      .same_workload();
  t.add("progress-interval", progress_interval_s, "seconds between progress lines when stderr is not a terminal [s]")
      .above(0)
      .no_effect();

  declare_profiling(t);
  checkpoint.declare(t);
}

runtime::GradSyncOptions TrainOptions::grad_sync_options(bool cuda_graphs) const {
  const auto bytes = [](double mb) { return std::max<std::size_t>(1, static_cast<std::size_t>(mb * 1024 * 1024)); };
  return {bytes(bucket_mb), bytes(first_bucket_mb), gradient_as_bucket_view, !cuda_graphs};
}

TrainOptions TrainOptions::for_world(int world_size) const {
  TrainOptions out = *this;
  if (global_batch_size == 0) return out;
  const std::int64_t per_micro_batch = batch_size * world_size;
  MGBENCH_REQUIRE(global_batch_size % per_micro_batch == 0, ConfigError,
                  "--global-batch-size {}: not a multiple of --batch-size {} x {} rank(s) = {} samples a micro-batch; "
                  "give a multiple of it, or another --batch-size or number of ranks",
                  global_batch_size, batch_size, world_size, per_micro_batch);
  out.grad_accum = global_batch_size / per_micro_batch;
  return out;
}

void TrainOptions::validate() const {
  checkpoint.validate();
  MGBENCH_REQUIRE(global_batch_size == 0 || grad_accum == 1, ConfigError,
                  "--global-batch-size {} with --grad-accum {}: the micro-batches per step follow from the global "
                  "batch size; give one of the two",
                  global_batch_size, grad_accum);
  MGBENCH_REQUIRE(repeat == 1 || checkpoint.dir.empty(), ConfigError,
                  "--repeat {} with --checkpoint-dir: a repeated job cannot be resumed; run the command {} times "
                  "instead (each may checkpoint), or leave out --checkpoint-dir",
                  repeat, repeat);
  if (sharding != axes::Sharding::kFsdp) return;
  const axes::StrategyInfo& s = axes::strategy_info(strategy);
  MGBENCH_REQUIRE(!s.single_process, ConfigError,
                  "--sharding fsdp with --strategy '{}': FSDP shards the model over one rank per device, and {} is "
                  "single-process (one rank drives every GPU); use a multi-rank strategy (ddp, ddp-rr, ddp-ds) or "
                  "--sharding none",
                  s.name, s.name);
}

}  // namespace mgbench::train
