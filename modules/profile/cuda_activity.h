#pragma once
// Aggregation of CUDA activity records (what CUPTI's activity API delivers: memory copies,
// runtime/driver API calls, kernels) into the per-rank totals of the results file, the figures
// the paper read from Nsight Systems (Lawenda et al. 2025, Fig. 3, 5, 6): HtoD copies (count,
// bytes, time), cudaLaunchKernel / cudaStreamSynchronize / ... calls and time, NCCL kernels,
// the top kernels by time. Pure bookkeeping, no CUDA: tested without a GPU.
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "results/schema.h"

namespace mgbench::profile {

enum class MemcpyKind { kHtoD, kDtoH, kDtoD, kOther };

/// What a copy was made for, as the thread that made it labelled it (CopyScope, cupti_collector.h):
/// the value is CUPTI's external correlation id. kOther: unlabelled.
enum class CopyPurpose : std::uint64_t { kOther = 0, kTrainBatch = 1, kEvalBatch = 2, kCollectiveStaging = 3 };

/// API functions always listed in cuda_api (zero when not called), in this order.
/// The cuda_api table's first rows, in this order, called or not: results::kLaunchApis and
/// kHostWaitApis among them (a unit test checks).
inline constexpr const char* kReportedApis[] = {
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync",       "cudaStreamSynchronize", "cudaEventSynchronize",
    "cudaEventDestroy", "cudaEventRecord",     "cudaEventQuery",        "cudaStreamWaitEvent",   "cudaMalloc",
    "cudaFree",         "cudaHostAlloc",       "cudaDeviceSynchronize", "cuLaunchKernel",        "cuLaunchKernelEx",
    "cudaGraphLaunch",  "cuGraphLaunch"};

/// "cudaLaunchKernel_v7000" -> "cudaLaunchKernel" (CUPTI's callback names carry the version).
std::string clean_api_name(std::string_view raw);
/// Demangles a kernel symbol and drops its argument list: "_Z3addPfS_" -> "add",
/// "void at::native::vectorized_elementwise_kernel<4, ...>(int, ...)" -> "at::native::vectorized_elementwise_kernel<4,
/// ...>".
std::string clean_kernel_name(std::string_view raw);
/// NCCL's kernels: ncclDevKernel_* (NCCL >= 2.19) and ncclKernel_* (older).
bool is_nccl_kernel(std::string_view clean_name);

class ActivityAggregator {
 public:
  /// A copy; correlation_ids: the API calls that made it (CUPTI's memcpy record: the driver's and
  /// the runtime's correlation id; 0 = none), by which add_external_correlation labels it, the
  /// label coming before or after the copy.
  void add_memcpy(MemcpyKind kind, std::uint64_t bytes, std::uint64_t start_ns, std::uint64_t end_ns, bool pinned_host,
                  std::array<std::uint32_t, 2> correlation_ids = {0, 0});
  /// CUPTI's external correlation record: the API call `correlation_id` was made inside a
  /// CopyScope of `purpose` (an unknown value counts as kOther).
  void add_external_correlation(std::uint32_t correlation_id, std::uint64_t purpose);
  void add_api(std::string_view raw_name, std::uint64_t start_ns, std::uint64_t end_ns);
  /// A kernel's execution on the device [start_ns, end_ns) (CUPTI's GPU timestamps), in any order:
  /// CUPTI delivers each buffer's records as they completed, streams interleaved.
  void add_kernel(std::string_view raw_name, std::uint64_t start_ns, std::uint64_t end_ns);
  void add_dropped(std::uint64_t records) { dropped_ += records; }
  /// The gaps between training steps, on CUPTI's clock (the records' timestamps): from a step's end
  /// (begin_between_steps, after its host sync) to the next step's start (end_between_steps). A
  /// record that starts in a gap -- an API call, a kernel, a copy; one still open at the record's
  /// delivery included -- goes to the between-steps totals instead of the steps' (fill_summary,
  /// api_rows, kernel_rows); the HtoD copies' purposes count every copy. A second begin while a
  /// gap is open, or an end without one, is ignored.
  void begin_between_steps(std::uint64_t ns);
  void end_between_steps(std::uint64_t ns);

  /// Totals into summary (the memcpy, kernel, kernel_busy_s, between_steps_* and dropped fields;
  /// between_steps_s sums the closed gaps; the caller sets the window less that, steps, samples and
  /// memory peaks).
  void fill_summary(results::CudaSummaryRecord& summary) const;
  /// kReportedApis first, then the other APIs by time, at most results::kCudaApiRows rows.
  std::vector<results::CudaApiRecord> api_rows() const;
  /// Every NCCL kernel (by time) and the other kernels by time, at most results::kCudaKernelRows
  /// rows, sorted by time.
  std::vector<results::CudaKernelRecord> kernel_rows() const;

 private:
  std::vector<results::CudaKernelRecord> kernel_rows_all() const;
  struct Totals {
    std::int64_t count = 0;
    std::uint64_t bytes = 0;
    std::uint64_t ns = 0;
    /// One record of [start_ns, end_ns) (a reversed interval adds no time) and its bytes.
    void add(std::uint64_t start_ns, std::uint64_t end_ns, std::uint64_t record_bytes = 0) {
      ++count;
      bytes += record_bytes;
      ns += end_ns > start_ns ? end_ns - start_ns : 0;
    }
  };
  void add_htod(CopyPurpose purpose, std::int64_t count, std::uint64_t bytes);
  Totals htod_, dtoh_, dtod_;
  std::int64_t htod_pinned_ = 0;
  // HtoD by purpose; labels not yet matched to a copy and copies not yet matched to a label, each by
  // correlation id, bounded (kPendingLimit: the oldest half dropped, its copies left unlabelled).
  std::array<Totals, 4> htod_by_purpose_{};
  std::map<std::uint32_t, CopyPurpose> labels_;
  std::map<std::uint32_t, std::pair<std::array<std::uint32_t, 2>, std::uint64_t>> unlabelled_htod_;  // ids, bytes
  std::map<std::string, Totals, std::less<>> apis_;
  std::map<std::string, Totals, std::less<>> kernels_;
  // The kernels' [start, end) intervals, merged into disjoint ones (sorted) whenever the list has
  // doubled since the last merge: memory is one interval per stretch of device time without a gap,
  // at most one per kernel (a host-bound step leaves a gap after each).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> kernel_intervals_;
  std::size_t merged_intervals_ = 0;
  std::uint64_t dropped_ = 0;
  /// Whether a record starting at start_ns falls in a gap between steps (an open one included).
  bool between_steps(std::uint64_t start_ns) const;
  // The gaps, in order, each [begin, end); an open one ends at kOpenGap.
  static constexpr std::uint64_t kOpenGap = std::numeric_limits<std::uint64_t>::max();
  std::vector<std::pair<std::uint64_t, std::uint64_t>> gaps_;
  Totals between_apis_, between_kernels_, between_copies_;
};

}  // namespace mgbench::profile
