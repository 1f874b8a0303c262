#include "profile/cuda_activity.h"
#include "profile/cupti_collector.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace mgbench::profile {
namespace {

double seconds(std::uint64_t ns) { return static_cast<double>(ns) * 1e-9; }

template <std::size_t N>
void copy_name(char (&dst)[N], const std::string& src) {
  const std::size_t n = std::min(N - 1, src.size());
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

}  // namespace

std::string clean_api_name(std::string_view raw) {
  const auto v = raw.rfind("_v");
  if (v != std::string_view::npos && v + 2 < raw.size() &&
      std::all_of(raw.begin() + static_cast<std::ptrdiff_t>(v + 2), raw.end(),
                  [](char c) { return c >= '0' && c <= '9'; })) {
    raw = raw.substr(0, v);
  }
  return std::string(raw);
}

std::string clean_kernel_name(std::string_view raw) {
  std::string name(raw);
  if (name.rfind("_Z", 0) == 0) {
    int status = 0;
    std::unique_ptr<char, decltype(&std::free)> demangled(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status),
                                                          &std::free);
    if (status == 0 && demangled) name = demangled.get();
  }
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);
  // Drop the argument list: the first '(' outside template brackets that does not open
  // "(anonymous namespace)" (a scope of the name: ATen's kernels in unnamed namespaces).
  constexpr std::string_view kAnonymous = "(anonymous namespace)";
  int depth = 0;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (name.compare(i, kAnonymous.size(), kAnonymous) == 0) {
      i += kAnonymous.size() - 1;
      continue;
    }
    if (name[i] == '<') ++depth;
    if (name[i] == '>') --depth;
    if (name[i] == '(' && depth == 0 && i > 0) {
      name.resize(i);
      break;
    }
  }
  return name;
}

bool is_nccl_kernel(std::string_view name) {
  return name.rfind("ncclDevKernel", 0) == 0 || name.rfind("ncclKernel", 0) == 0;
}

namespace {

/// Labels and copies waiting for their match, at most this many (each map): past it the oldest
/// half (the lowest correlation ids: CUPTI counts them up) is dropped. A label meets its copy within
/// a CUPTI buffer or two; what waits longer is an API call that copied nothing, or a copy nobody
/// labelled.
constexpr std::size_t kPendingLimit = std::size_t{1} << 16;

template <typename Map>
void bound(Map& pending) {
  if (pending.size() <= kPendingLimit) return;
  auto end = pending.begin();
  std::advance(end, static_cast<std::ptrdiff_t>(pending.size() / 2));
  pending.erase(pending.begin(), end);
}

/// Sorts intervals and merges the overlapping and touching ones, in place.
void merge_intervals(std::vector<std::pair<std::uint64_t, std::uint64_t>>& intervals) {
  std::sort(intervals.begin(), intervals.end());
  std::size_t kept = 0;
  for (const auto& interval : intervals) {
    if (kept > 0 && interval.first <= intervals[kept - 1].second) {
      intervals[kept - 1].second = std::max(intervals[kept - 1].second, interval.second);
    } else {
      intervals[kept++] = interval;
    }
  }
  intervals.resize(kept);
}

/// Merges once the list has grown to twice what the last merge left, and at least this many:
/// amortised O(log n) a kernel.
constexpr std::size_t kMergeAtLeast = 4096;

CopyPurpose purpose_of(std::uint64_t id) {
  return id >= 1 && id <= 3 ? static_cast<CopyPurpose>(id) : CopyPurpose::kOther;
}

}  // namespace

void ActivityAggregator::add_memcpy(MemcpyKind kind, std::uint64_t bytes, std::uint64_t start_ns, std::uint64_t end_ns,
                                    bool pinned_host, std::array<std::uint32_t, 2> correlation_ids) {
  Totals* t = kind == MemcpyKind::kHtoD   ? &htod_
              : kind == MemcpyKind::kDtoH ? &dtoh_
              : kind == MemcpyKind::kDtoD ? &dtod_
                                          : nullptr;
  if (t == nullptr) return;
  const bool between = between_steps(start_ns);
  if (between) t = &between_copies_;
  t->add(start_ns, end_ns, bytes);
  if (kind != MemcpyKind::kHtoD) return;
  if (pinned_host && !between) ++htod_pinned_;
  // Labelled by purpose in the gaps too: the evaluation's batches are copied there.
  for (const std::uint32_t id : correlation_ids) {
    const auto label = id != 0 ? labels_.find(id) : labels_.end();
    if (label == labels_.end()) continue;
    add_htod(label->second, 1, bytes);
    for (const std::uint32_t other : correlation_ids) labels_.erase(other);
    return;
  }
  for (const std::uint32_t id : correlation_ids) {
    if (id != 0) unlabelled_htod_[id] = {correlation_ids, bytes};
  }
  bound(unlabelled_htod_);
}

void ActivityAggregator::add_external_correlation(std::uint32_t correlation_id, std::uint64_t purpose) {
  const CopyPurpose p = purpose_of(purpose);
  if (p == CopyPurpose::kOther || correlation_id == 0) return;
  if (const auto copy = unlabelled_htod_.find(correlation_id); copy != unlabelled_htod_.end()) {
    const auto [ids, bytes] = copy->second;
    add_htod(p, 1, bytes);
    for (const std::uint32_t id : ids) unlabelled_htod_.erase(id);
    return;
  }
  labels_[correlation_id] = p;
  bound(labels_);
}

void ActivityAggregator::add_htod(CopyPurpose purpose, std::int64_t count, std::uint64_t bytes) {
  Totals& t = htod_by_purpose_[static_cast<std::size_t>(purpose)];
  t.count += count;
  t.bytes += bytes;
}

void ActivityAggregator::add_api(std::string_view raw_name, std::uint64_t start_ns, std::uint64_t end_ns) {
  if (between_steps(start_ns)) {
    between_apis_.add(start_ns, end_ns);
    return;
  }
  auto it = apis_.find(raw_name);
  if (it == apis_.end()) it = apis_.emplace(std::string(raw_name), Totals{}).first;
  it->second.add(start_ns, end_ns);
}

void ActivityAggregator::add_kernel(std::string_view raw_name, std::uint64_t start_ns, std::uint64_t end_ns) {
  if (between_steps(start_ns)) {
    between_kernels_.add(start_ns, end_ns);
    return;
  }
  auto it = kernels_.find(raw_name);
  if (it == kernels_.end()) it = kernels_.emplace(std::string(raw_name), Totals{}).first;
  it->second.add(start_ns, end_ns);
  if (end_ns <= start_ns) return;
  kernel_intervals_.emplace_back(start_ns, end_ns);
  if (kernel_intervals_.size() >= std::max(kMergeAtLeast, 2 * merged_intervals_)) {
    merge_intervals(kernel_intervals_);
    merged_intervals_ = kernel_intervals_.size();
  }
}

void ActivityAggregator::begin_between_steps(std::uint64_t ns) {
  if (!gaps_.empty() && gaps_.back().second == kOpenGap) return;
  gaps_.emplace_back(ns, kOpenGap);
}

void ActivityAggregator::end_between_steps(std::uint64_t ns) {
  if (gaps_.empty() || gaps_.back().second != kOpenGap) return;
  gaps_.back().second = std::max(ns, gaps_.back().first);
}

bool ActivityAggregator::between_steps(std::uint64_t start_ns) const {
  // Records come roughly in time order: the newest gaps are searched first.
  for (auto gap = gaps_.rbegin(); gap != gaps_.rend(); ++gap) {
    if (start_ns >= gap->second) return false;
    if (start_ns >= gap->first) return true;
  }
  return false;
}

void ActivityAggregator::fill_summary(results::CudaSummaryRecord& s) const {
  s.htod_count = htod_.count;
  s.htod_bytes = static_cast<std::int64_t>(htod_.bytes);
  s.htod_s = seconds(htod_.ns);
  s.htod_pinned_count = htod_pinned_;
  const auto& by = htod_by_purpose_;
  const auto of = [&](CopyPurpose p) { return by[static_cast<std::size_t>(p)]; };
  s.htod_train_count = of(CopyPurpose::kTrainBatch).count;
  s.htod_train_bytes = static_cast<std::int64_t>(of(CopyPurpose::kTrainBatch).bytes);
  s.htod_eval_count = of(CopyPurpose::kEvalBatch).count;
  s.htod_eval_bytes = static_cast<std::int64_t>(of(CopyPurpose::kEvalBatch).bytes);
  s.htod_staging_count = of(CopyPurpose::kCollectiveStaging).count;
  s.htod_staging_bytes = static_cast<std::int64_t>(of(CopyPurpose::kCollectiveStaging).bytes);
  s.dtoh_count = dtoh_.count;
  s.dtoh_bytes = static_cast<std::int64_t>(dtoh_.bytes);
  s.dtoh_s = seconds(dtoh_.ns);
  s.dtod_count = dtod_.count;
  s.dtod_bytes = static_cast<std::int64_t>(dtod_.bytes);
  s.dtod_s = seconds(dtod_.ns);
  s.kernel_count = 0;
  s.kernel_s = 0;
  s.nccl_kernel_count = 0;
  s.nccl_kernel_s = 0;
  for (const auto& row : kernel_rows_all()) {
    s.kernel_count += row.count;
    s.kernel_s += row.time_s;
    if (row.nccl != 0) {
      s.nccl_kernel_count += row.count;
      s.nccl_kernel_s += row.time_s;
    }
  }
  auto busy = kernel_intervals_;
  merge_intervals(busy);
  std::uint64_t busy_ns = 0;
  for (const auto& [start, end] : busy) busy_ns += end - start;
  s.kernel_busy_s = seconds(busy_ns);
  s.dropped_records = static_cast<std::int64_t>(dropped_);
  std::uint64_t gaps_ns = 0;
  for (const auto& [begin, end] : gaps_) {
    if (end != kOpenGap) gaps_ns += end - begin;
  }
  s.between_steps_s = seconds(gaps_ns);
  s.between_steps_api_calls = between_apis_.count;
  s.between_steps_kernel_count = between_kernels_.count;
  s.between_steps_kernel_s = seconds(between_kernels_.ns);
  s.between_steps_copy_count = between_copies_.count;
  s.between_steps_copy_bytes = static_cast<std::int64_t>(between_copies_.bytes);
}

std::vector<results::CudaApiRecord> ActivityAggregator::api_rows() const {
  std::map<std::string, Totals, std::less<>> merged;  // by clean name: versions of one function add up
  for (const auto& [raw, t] : apis_) {
    Totals& m = merged[clean_api_name(raw)];
    m.count += t.count;
    m.ns += t.ns;
  }
  std::vector<results::CudaApiRecord> rows;
  for (const char* name : kReportedApis) {
    results::CudaApiRecord r;
    copy_name(r.name, name);
    if (auto it = merged.find(std::string_view(name)); it != merged.end()) {
      r.calls = it->second.count;
      r.time_s = seconds(it->second.ns);
      merged.erase(it);
    }
    rows.push_back(r);
  }
  std::vector<std::pair<std::string, Totals>> others(merged.begin(), merged.end());
  std::sort(others.begin(), others.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  for (const auto& [name, t] : others) {
    if (static_cast<std::int64_t>(rows.size()) >= results::kCudaApiRows) break;
    results::CudaApiRecord r;
    copy_name(r.name, name);
    r.calls = t.count;
    r.time_s = seconds(t.ns);
    rows.push_back(r);
  }
  return rows;
}

std::vector<results::CudaKernelRecord> ActivityAggregator::kernel_rows_all() const {
  std::map<std::string, Totals, std::less<>> merged;  // by clean name
  for (const auto& [raw, t] : kernels_) {
    Totals& m = merged[clean_kernel_name(raw)];
    m.count += t.count;
    m.ns += t.ns;
  }
  std::vector<results::CudaKernelRecord> rows;
  for (const auto& [name, t] : merged) {
    results::CudaKernelRecord r;
    copy_name(r.name, name);
    r.count = t.count;
    r.time_s = seconds(t.ns);
    r.nccl = is_nccl_kernel(name) ? 1 : 0;
    rows.push_back(r);
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.time_s > b.time_s; });
  return rows;
}

std::vector<results::CudaKernelRecord> ActivityAggregator::kernel_rows() const {
  const auto all = kernel_rows_all();
  const auto limit = static_cast<std::size_t>(results::kCudaKernelRows);
  std::vector<results::CudaKernelRecord> rows;
  for (const auto& r : all) {  // NCCL kernels are kept whatever their rank by time
    if (r.nccl != 0 && rows.size() < limit / 2) rows.push_back(r);
  }
  for (const auto& r : all) {
    if (rows.size() >= limit) break;
    if (r.nccl == 0) rows.push_back(r);
  }
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.time_s > b.time_s; });
  return rows;
}

std::string external_cuda_profiler() {
  // nsys sets the session id; any CUDA tool injects itself through CUDA_INJECTION64_PATH.
  if (const char* session = std::getenv("NSYS_PROFILING_SESSION_ID"); session != nullptr && *session != '\0') {
    return "Nsight Systems (NSYS_PROFILING_SESSION_ID is set)";
  }
  if (const char* injection = std::getenv("CUDA_INJECTION64_PATH"); injection != nullptr && *injection != '\0') {
    return std::string("a CUDA tool injected through CUDA_INJECTION64_PATH=") + injection;
  }
  return "";
}

}  // namespace mgbench::profile
