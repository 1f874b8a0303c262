#include "profile/nvtx.h"

#include <atomic>

#include "core/config.h"

#ifdef MGBENCH_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace mgbench::profile {
namespace {
std::atomic<bool> g_enabled{true};
}

void set_nvtx_enabled(bool enabled) { g_enabled = enabled; }

NvtxRange::NvtxRange(const char* name) {
#ifdef MGBENCH_HAVE_NVTX
  if (g_enabled.load(std::memory_order_relaxed)) {
    nvtxRangePushA(name);
    pushed_ = true;
  }
#else
  (void)name;
#endif
}

NvtxRange::~NvtxRange() {
#ifdef MGBENCH_HAVE_NVTX
  if (pushed_) nvtxRangePop();
#endif
}

}  // namespace mgbench::profile
