#pragma once
// The training loop's finish stage (loop.h): the run's CUDA metrics, and its summary -- the figures
// of all ranks summed (samples, tokens, FLOPs after the warm-up) into throughput, s/it, tokens/s and
// MFU against the device's peak (runtime/peak_flops.h), the peak memory -- written by rank 0, and
// the final checkpoint. Internal to the loop.
#include <cstdint>

#include <torch/torch.h>

#include "results/schema.h"
#include "results/writer.h"
#include "runtime/peak_flops.h"
#include "train/epoch.h"
#include "train/loop_state.h"

namespace mgbench::train {

class TrainingLoop;

/// The peak FLOP/s this run's MFU divides by: the device's and arithmetic's (the autocast dtype, or
/// the parameters'; TF32 where the precision allows it), or --peak-tflops.
runtime::PeakFlops run_peak_flops(const RunSetup& setup);

/// Peak memory of this process on its device: the CUDA caching allocator's peak allocation, or the
/// peak resident set size on the CPU since the program started (host_memory::peak_resident_bytes:
/// /proc/self/status's VmHWM), in bytes. Throws std::runtime_error where /proc has no VmHWM.
std::int64_t peak_memory_bytes(const torch::Device& device);

/// The run's end, on every rank: CUDA metrics (rank tables), the figures of all ranks in the summary
/// (rank 0 writes it), the final checkpoint (a later --resume finds the run done). Collective.
/// Returns the summary.
results::RunSummary finish_run(LoopState& state, const TrainingLoop& loop, const RunSinks& sinks);

/// The summary of an evaluate-only run (its one evaluation's loss and accuracy, its time), written
/// by rank 0. Collective (the transports' gather).
results::RunSummary evaluation_summary(const LoopState& state, const EvalResult& result, double eval_s,
                                       results::ResultsWriter& writer);

}  // namespace mgbench::train
