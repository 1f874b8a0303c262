#include "profile/cupti_collector.h"

#include "core/config.h"
#include "core/error.h"

#if !MGBENCH_HAVE_CUPTI

namespace mgbench::profile {
std::unique_ptr<CuptiCollector> CuptiCollector::create() { return nullptr; }
CopyScope::CopyScope(CopyPurpose) {}
CopyScope::~CopyScope() = default;
}  // namespace mgbench::profile

#else

#include <cupti.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include <fmt/format.h>

namespace mgbench::profile {
namespace {

constexpr std::size_t kBufferBytes = 8 << 20;  // per CUPTI buffer
constexpr std::size_t kAlign = 8;

void check_cupti(CUptiResult rc, const char* what) {
  if (rc == CUPTI_SUCCESS) return;
  const char* message = nullptr;
  cuptiGetResultString(rc, &message);
  throw Error(fmt::format("CUPTI: {} failed: {}", what, message != nullptr ? message : "unknown error"));
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_RUNTIME,
                                         CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};
constexpr CUpti_ExternalCorrelationKind kCopyLabels = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;

// Whether a collector records (CopyScope labels only then).
std::atomic<bool> g_recording{false};

// CUPTI calls these from its own threads; the aggregator is guarded by g_mutex.
std::mutex g_mutex;
ActivityAggregator g_totals;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

std::string api_name(CUpti_CallbackDomain domain, CUpti_CallbackId cbid) {
  const char* name = nullptr;
  if (cuptiGetCallbackName(domain, cbid, &name) != CUPTI_SUCCESS || name == nullptr)
    return fmt::format("cbid_{}", cbid);
  return name;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t stream_id, uint8_t* buffer, size_t, size_t valid_size) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid_size, &record) == CUPTI_SUCCESS) {
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
          MemcpyKind kind = MemcpyKind::kOther;
          if (m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD) kind = MemcpyKind::kHtoD;
          if (m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH) kind = MemcpyKind::kDtoH;
          if (m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOD) kind = MemcpyKind::kDtoD;
          g_totals.add_memcpy(kind, m->bytes, m->start, m->end, m->srcKind == CUPTI_ACTIVITY_MEMORY_KIND_PINNED,
                              {m->correlationId, m->runtimeCorrelationId});
          break;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
          const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
          if (e->externalKind == kCopyLabels) g_totals.add_external_correlation(e->correlationId, e->externalId);
          break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME:
        case CUPTI_ACTIVITY_KIND_DRIVER: {
          const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
          const auto domain =
              record->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API;
          g_totals.add_api(api_name(domain, a->cbid), a->start, a->end);
          break;
        }
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
          g_totals.add_kernel(k->name != nullptr ? k->name : "unknown", k->start, k->end);
          break;
        }
        default:
          break;
      }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(nullptr, stream_id, &dropped) == CUPTI_SUCCESS) g_totals.add_dropped(dropped);
  }
  std::free(buffer);
}

std::atomic<bool> g_created{false};

class Collector final : public CuptiCollector {
 public:
  Collector() {
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_totals = ActivityAggregator();
    }
    check_cupti(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  }
  ~Collector() override {
    try {
      if (running_) stop();
    } catch (...) {
    }
    g_created = false;
  }
  void start() override {
    for (auto kind : kKinds) check_cupti(cuptiActivityEnable(kind), "cuptiActivityEnable");
    running_ = true;
    g_recording = true;
  }
  void stop() override {
    g_recording = false;
    for (auto kind : kKinds) cuptiActivityDisable(kind);
    running_ = false;
    check_cupti(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  }
  bool running() const override { return running_; }
  void begin_between_steps() override { stamp(&ActivityAggregator::begin_between_steps); }
  void end_between_steps() override { stamp(&ActivityAggregator::end_between_steps); }
  const ActivityAggregator& totals() override {
    cuptiActivityFlushAll(0);
    return g_totals;
  }

 private:
  /// Hands CUPTI's time now to the aggregator's `mark` (its records' clock).
  static void stamp(void (ActivityAggregator::*mark)(std::uint64_t)) {
    std::uint64_t now = 0;
    check_cupti(cuptiGetTimestamp(&now), "cuptiGetTimestamp");
    std::lock_guard<std::mutex> lock(g_mutex);
    (g_totals.*mark)(now);
  }
  bool running_ = false;
};

}  // namespace

CopyScope::CopyScope(CopyPurpose purpose) {
  if (!g_recording.load(std::memory_order_relaxed)) return;
  pushed_ = cuptiActivityPushExternalCorrelationId(kCopyLabels, static_cast<std::uint64_t>(purpose)) == CUPTI_SUCCESS;
}

CopyScope::~CopyScope() {
  if (pushed_) cuptiActivityPopExternalCorrelationId(kCopyLabels, nullptr);
}

std::unique_ptr<CuptiCollector> CuptiCollector::create() {
  if (g_created.exchange(true)) throw Error("CUPTI collector: only one at a time per process");
  return std::make_unique<Collector>();
}

}  // namespace mgbench::profile

#endif  // MGBENCH_HAVE_CUPTI
