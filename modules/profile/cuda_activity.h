#pragma once
// Aggregation of CUDA activity records (what CUPTI's activity API delivers: memory copies,
// runtime/driver API calls, kernels) into the per-rank totals of the results file, the figures
// the paper read from Nsight Systems (Lawenda et al. 2025, Fig. 3, 5, 6): HtoD copies (count,
// bytes, time), cudaLaunchKernel / cudaStreamSynchronize / ... calls and time, NCCL kernels,
// the top kernels by time. Pure bookkeeping, no CUDA: tested without a GPU.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "results/schema.h"

namespace mgbench::profile {

enum class MemcpyKind { kHtoD, kDtoH, kDtoD, kOther };

/// API functions always listed in cuda_api (zero when not called), in this order.
inline constexpr const char* kReportedApis[] = {
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync",       "cudaStreamSynchronize", "cudaEventSynchronize",
    "cudaEventDestroy", "cudaEventRecord",     "cudaEventQuery",        "cudaStreamWaitEvent",   "cudaMalloc",
    "cudaFree",         "cudaHostAlloc",       "cudaDeviceSynchronize", "cuLaunchKernel",        "cuLaunchKernelEx"};

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
  void add_memcpy(MemcpyKind kind, std::uint64_t bytes, std::uint64_t start_ns, std::uint64_t end_ns, bool pinned_host);
  void add_api(std::string_view raw_name, std::uint64_t start_ns, std::uint64_t end_ns);
  void add_kernel(std::string_view raw_name, std::uint64_t start_ns, std::uint64_t end_ns);
  void add_dropped(std::uint64_t records) { dropped_ += records; }

  /// Totals into summary (the memcpy, kernel and dropped fields; the caller sets the window,
  /// samples and memory peaks).
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
  };
  Totals htod_, dtoh_, dtod_;
  std::int64_t htod_pinned_ = 0;
  std::map<std::string, Totals, std::less<>> apis_;
  std::map<std::string, Totals, std::less<>> kernels_;
  std::uint64_t dropped_ = 0;
};

}  // namespace mgbench::profile
