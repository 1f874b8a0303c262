#include "results/schema.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <variant>

namespace mgbench::results {
namespace {

using h5::check_status;

void insert(hid_t type, const char* name, std::size_t offset, hid_t member) {
  check_status(H5Tinsert(type, name, offset, member), std::string("compound member ") + name);
}

void insert_phases(hid_t type, std::size_t base) {
  for (const auto& f : kPhaseFields) {
    // Offset of the member inside PhaseTimes, from the member pointer.
    const PhaseTimes probe;
    const auto offset = static_cast<std::size_t>(reinterpret_cast<const char*>(&(probe.*f.seconds)) -
                                                 reinterpret_cast<const char*>(&probe));
    insert(type, (std::string(f.name) + "_s").c_str(), base + offset, H5T_NATIVE_DOUBLE);
  }
}

}  // namespace

bool is_results_file(hid_t file) {
  for (const auto& [name, value] : h5::read_attributes(file)) {
    if (name == "schema") {
      return std::holds_alternative<std::string>(value) && std::get<std::string>(value) == kSchemaName &&
             h5::link_exists(file, "runs");
    }
  }
  return false;
}

h5::Handle step_record_type() {
  auto t = h5::wrap_type(H5Tcreate(H5T_COMPOUND, sizeof(StepRecord)), "create step record type");
  insert(t, "epoch", offsetof(StepRecord, epoch), H5T_NATIVE_INT32);
  insert(t, "step", offsetof(StepRecord, step), H5T_NATIVE_INT64);
  insert(t, "batch_index", offsetof(StepRecord, batch_index), H5T_NATIVE_INT64);
  insert(t, "start_s", offsetof(StepRecord, start_s), H5T_NATIVE_DOUBLE);
  insert_phases(t, offsetof(StepRecord, phases));
  insert(t, "step_s", offsetof(StepRecord, step_s), H5T_NATIVE_DOUBLE);
  insert(t, "loss", offsetof(StepRecord, loss), H5T_NATIVE_DOUBLE);
  insert(t, "samples", offsetof(StepRecord, samples), H5T_NATIVE_INT64);
  insert(t, "allreduce_window_s", offsetof(StepRecord, allreduce_window_s), H5T_NATIVE_DOUBLE);
  insert(t, "loss_scale", offsetof(StepRecord, loss_scale), H5T_NATIVE_DOUBLE);
  insert(t, "skipped", offsetof(StepRecord, skipped), H5T_NATIVE_INT8);
  insert(t, "tokens", offsetof(StepRecord, tokens), H5T_NATIVE_INT64);
  insert(t, "padded_tokens", offsetof(StepRecord, padded_tokens), H5T_NATIVE_INT64);
  insert(t, "allgather_s", offsetof(StepRecord, allgather_s), H5T_NATIVE_DOUBLE);
  insert(t, "reducescatter_s", offsetof(StepRecord, reducescatter_s), H5T_NATIVE_DOUBLE);
  insert(t, "lr", offsetof(StepRecord, lr), H5T_NATIVE_DOUBLE);
  insert(t, "page_faults", offsetof(StepRecord, page_faults), H5T_NATIVE_INT64);
  insert(t, "cuda_graph", offsetof(StepRecord, cuda_graph), H5T_NATIVE_INT8);
  return t;
}

h5::Handle epoch_record_type() {
  auto t = h5::wrap_type(H5Tcreate(H5T_COMPOUND, sizeof(EpochRecord)), "create epoch record type");
  insert(t, "epoch", offsetof(EpochRecord, epoch), H5T_NATIVE_INT32);
  insert(t, "steps", offsetof(EpochRecord, steps), H5T_NATIVE_INT64);
  insert(t, "samples", offsetof(EpochRecord, samples), H5T_NATIVE_INT64);
  insert(t, "loaded_samples", offsetof(EpochRecord, loaded_samples), H5T_NATIVE_INT64);
  insert(t, "train_s", offsetof(EpochRecord, train_s), H5T_NATIVE_DOUBLE);
  insert_phases(t, offsetof(EpochRecord, phases));
  insert(t, "loss_mean", offsetof(EpochRecord, loss_mean), H5T_NATIVE_DOUBLE);
  insert(t, "samples_per_s", offsetof(EpochRecord, samples_per_s), H5T_NATIVE_DOUBLE);
  insert(t, "eval_s", offsetof(EpochRecord, eval_s), H5T_NATIVE_DOUBLE);
  insert(t, "test_correct", offsetof(EpochRecord, test_correct), H5T_NATIVE_INT64);
  insert(t, "test_samples", offsetof(EpochRecord, test_samples), H5T_NATIVE_INT64);
  insert(t, "test_accuracy", offsetof(EpochRecord, test_accuracy), H5T_NATIVE_DOUBLE);
  insert(t, "allreduce_window_s", offsetof(EpochRecord, allreduce_window_s), H5T_NATIVE_DOUBLE);
  insert(t, "skipped_steps", offsetof(EpochRecord, skipped_steps), H5T_NATIVE_INT64);
  insert(t, "eval_loss", offsetof(EpochRecord, eval_loss), H5T_NATIVE_DOUBLE);
  insert(t, "allgather_s", offsetof(EpochRecord, allgather_s), H5T_NATIVE_DOUBLE);
  insert(t, "reducescatter_s", offsetof(EpochRecord, reducescatter_s), H5T_NATIVE_DOUBLE);
  insert(t, "skipped_images", offsetof(EpochRecord, skipped_images), H5T_NATIVE_INT64);
  return t;
}

h5::Handle run_summary_type() {
  auto t = h5::wrap_type(H5Tcreate(H5T_COMPOUND, sizeof(RunSummary)), "create summary type");
  insert(t, "total_s", offsetof(RunSummary, total_s), H5T_NATIVE_DOUBLE);
  insert(t, "train_s", offsetof(RunSummary, train_s), H5T_NATIVE_DOUBLE);
  insert(t, "eval_s", offsetof(RunSummary, eval_s), H5T_NATIVE_DOUBLE);
  insert(t, "samples_per_s", offsetof(RunSummary, samples_per_s), H5T_NATIVE_DOUBLE);
  insert(t, "final_loss", offsetof(RunSummary, final_loss), H5T_NATIVE_DOUBLE);
  insert(t, "test_accuracy", offsetof(RunSummary, test_accuracy), H5T_NATIVE_DOUBLE);
  insert(t, "epochs_completed", offsetof(RunSummary, epochs_completed), H5T_NATIVE_INT64);
  insert(t, "finished_unix_s", offsetof(RunSummary, finished_unix_s), H5T_NATIVE_DOUBLE);
  insert(t, "s_per_it", offsetof(RunSummary, s_per_it), H5T_NATIVE_DOUBLE);
  insert(t, "tokens_per_s", offsetof(RunSummary, tokens_per_s), H5T_NATIVE_DOUBLE);
  insert(t, "mfu", offsetof(RunSummary, mfu), H5T_NATIVE_DOUBLE);
  insert(t, "eval_loss", offsetof(RunSummary, eval_loss), H5T_NATIVE_DOUBLE);
  insert(t, "peak_memory_bytes", offsetof(RunSummary, peak_memory_bytes), H5T_NATIVE_INT64);
  insert(t, "padded_tokens_per_s", offsetof(RunSummary, padded_tokens_per_s), H5T_NATIVE_DOUBLE);
  insert(t, "ops_per_step", offsetof(RunSummary, ops_per_step), H5T_NATIVE_INT64);
  const h5::Handle transports = h5::fixed_string_type(kTransportsBytes);
  insert(t, "nccl_transports", offsetof(RunSummary, nccl_transports), transports);
  insert(t, "checkpoint_s", offsetof(RunSummary, checkpoint_s), H5T_NATIVE_DOUBLE);
  return t;
}

h5::Handle cuda_summary_type() {
  auto t = h5::wrap_type(H5Tcreate(H5T_COMPOUND, sizeof(CudaSummaryRecord)), "create CUDA summary type");
#define MGBENCH_FIELD(name, type) insert(t, #name, offsetof(CudaSummaryRecord, name), type)
  MGBENCH_FIELD(window_start_s, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(window_s, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(htod_count, H5T_NATIVE_INT64);
  MGBENCH_FIELD(htod_bytes, H5T_NATIVE_INT64);
  MGBENCH_FIELD(htod_s, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(htod_pinned_count, H5T_NATIVE_INT64);
  MGBENCH_FIELD(dtoh_count, H5T_NATIVE_INT64);
  MGBENCH_FIELD(dtoh_bytes, H5T_NATIVE_INT64);
  MGBENCH_FIELD(dtoh_s, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(dtod_count, H5T_NATIVE_INT64);
  MGBENCH_FIELD(dtod_bytes, H5T_NATIVE_INT64);
  MGBENCH_FIELD(dtod_s, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(kernel_count, H5T_NATIVE_INT64);
  MGBENCH_FIELD(kernel_s, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(nccl_kernel_count, H5T_NATIVE_INT64);
  MGBENCH_FIELD(nccl_kernel_s, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(samples, H5T_NATIVE_INT64);
  MGBENCH_FIELD(peak_allocated_bytes, H5T_NATIVE_INT64);
  MGBENCH_FIELD(peak_reserved_bytes, H5T_NATIVE_INT64);
  MGBENCH_FIELD(dropped_records, H5T_NATIVE_INT64);
  MGBENCH_FIELD(htod_train_count, H5T_NATIVE_INT64);
  MGBENCH_FIELD(htod_train_bytes, H5T_NATIVE_INT64);
  MGBENCH_FIELD(htod_eval_count, H5T_NATIVE_INT64);
  MGBENCH_FIELD(htod_eval_bytes, H5T_NATIVE_INT64);
  MGBENCH_FIELD(htod_staging_count, H5T_NATIVE_INT64);
  MGBENCH_FIELD(htod_staging_bytes, H5T_NATIVE_INT64);
  MGBENCH_FIELD(steps, H5T_NATIVE_INT64);
  MGBENCH_FIELD(kernel_busy_s, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(between_steps_s, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(between_steps_api_calls, H5T_NATIVE_INT64);
  MGBENCH_FIELD(between_steps_kernel_count, H5T_NATIVE_INT64);
  MGBENCH_FIELD(between_steps_kernel_s, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(between_steps_copy_count, H5T_NATIVE_INT64);
  MGBENCH_FIELD(between_steps_copy_bytes, H5T_NATIVE_INT64);
#undef MGBENCH_FIELD
  return t;
}

h5::Handle cuda_api_type() {
  auto t = h5::wrap_type(H5Tcreate(H5T_COMPOUND, sizeof(CudaApiRecord)), "create CUDA API type");
  insert(t, "name", offsetof(CudaApiRecord, name), h5::fixed_string_type(sizeof(CudaApiRecord::name)));
  insert(t, "calls", offsetof(CudaApiRecord, calls), H5T_NATIVE_INT64);
  insert(t, "time_s", offsetof(CudaApiRecord, time_s), H5T_NATIVE_DOUBLE);
  return t;
}

h5::Handle cuda_kernel_type() {
  auto t = h5::wrap_type(H5Tcreate(H5T_COMPOUND, sizeof(CudaKernelRecord)), "create CUDA kernel type");
  insert(t, "name", offsetof(CudaKernelRecord, name), h5::fixed_string_type(sizeof(CudaKernelRecord::name)));
  insert(t, "count", offsetof(CudaKernelRecord, count), H5T_NATIVE_INT64);
  insert(t, "time_s", offsetof(CudaKernelRecord, time_s), H5T_NATIVE_DOUBLE);
  insert(t, "nccl", offsetof(CudaKernelRecord, nccl), H5T_NATIVE_INT8);
  return t;
}

h5::Handle comm_record_type() {
  auto t = h5::wrap_type(H5Tcreate(H5T_COMPOUND, sizeof(CommRecord)), "create comm record type");
  insert(t, "collective", offsetof(CommRecord, collective), h5::fixed_string_type(sizeof(CommRecord::collective)));
  insert(t, "dtype", offsetof(CommRecord, dtype), h5::fixed_string_type(sizeof(CommRecord::dtype)));
  insert(t, "op", offsetof(CommRecord, op), h5::fixed_string_type(sizeof(CommRecord::op)));
  insert(t, "root", offsetof(CommRecord, root), H5T_NATIVE_INT32);
  insert(t, "in_place", offsetof(CommRecord, in_place), H5T_NATIVE_INT8);
  insert(t, "bytes", offsetof(CommRecord, bytes), H5T_NATIVE_INT64);
  insert(t, "count", offsetof(CommRecord, count), H5T_NATIVE_INT64);
  insert(t, "iters", offsetof(CommRecord, iters), H5T_NATIVE_INT64);
  insert(t, "time_s", offsetof(CommRecord, time_s), H5T_NATIVE_DOUBLE);
  insert(t, "algbw_gbs", offsetof(CommRecord, algbw_gbs), H5T_NATIVE_DOUBLE);
  insert(t, "busbw_gbs", offsetof(CommRecord, busbw_gbs), H5T_NATIVE_DOUBLE);
  insert(t, "wrong", offsetof(CommRecord, wrong), H5T_NATIVE_INT64);
  return t;
}

h5::Handle energy_record_type() {
  auto t = h5::wrap_type(H5Tcreate(H5T_COMPOUND, sizeof(EnergyRecord)), "create energy record type");
  insert(t, "source", offsetof(EnergyRecord, source), h5::fixed_string_type(sizeof(EnergyRecord::source)));
#define MGBENCH_FIELD(name, type) insert(t, #name, offsetof(EnergyRecord, name), type)
  MGBENCH_FIELD(node_share, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(span_s, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(energy_j, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(mean_power_w, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(max_power_w, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(mean_sm_clock_mhz, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(mean_mem_clock_mhz, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(max_temperature_c, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(throttled_s, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(readings, H5T_NATIVE_INT64);
  MGBENCH_FIELD(samples, H5T_NATIVE_INT64);
  MGBENCH_FIELD(tokens, H5T_NATIVE_INT64);
#undef MGBENCH_FIELD
  return t;
}

h5::Handle telemetry_record_type() {
  auto t = h5::wrap_type(H5Tcreate(H5T_COMPOUND, sizeof(TelemetryRecord)), "create telemetry record type");
#define MGBENCH_FIELD(name, type) insert(t, #name, offsetof(TelemetryRecord, name), type)
  MGBENCH_FIELD(t_s, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(energy_j, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(power_w, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(sm_clock_mhz, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(mem_clock_mhz, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(temperature_c, H5T_NATIVE_DOUBLE);
  MGBENCH_FIELD(throttle_reasons, H5T_NATIVE_UINT64);
#undef MGBENCH_FIELD
  return t;
}

void RunSummary::set_transports(std::string_view text) {
  nccl_transports.fill('\0');
  std::memcpy(nccl_transports.data(), text.data(), std::min(text.size(), kTransportsBytes - 1));
}

}  // namespace mgbench::results
