#include "profile/nvtx.h"

#include <atomic>

#include "core/config.h"

#if MGBENCH_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace mgbench::profile {
namespace {
std::atomic<bool> g_enabled{true};
}

void set_nvtx_enabled(bool enabled) { g_enabled = enabled; }

NvtxRange::NvtxRange(const char* name) {
#if MGBENCH_HAVE_NVTX
  if (g_enabled.load(std::memory_order_relaxed)) {
    nvtxRangePushA(name);
    pushed_ = true;
  }
#else
  (void)name;
#endif
}

NvtxRange::~NvtxRange() {
#if MGBENCH_HAVE_NVTX
  if (pushed_) nvtxRangePop();
#endif
}

std::uint64_t nvtx_range_start(const char* name) {
#if MGBENCH_HAVE_NVTX
  if (g_enabled.load(std::memory_order_relaxed)) return nvtxRangeStartA(name);  // 0: no tool attached
#else
  (void)name;
#endif
  return 0;
}

void nvtx_range_end(std::uint64_t id) {
#if MGBENCH_HAVE_NVTX
  if (id != 0) nvtxRangeEnd(id);
#else
  (void)id;
#endif
}

}  // namespace mgbench::profile
