#include "runtime/agreement.h"

#include <fmt/format.h>

#include "core/agreement.h"
#include "core/log.h"

namespace mgbench::runtime {

bool all_succeed(const MpiEnvironment& env, std::string_view stage, const std::function<void()>& step) {
  const Agreement a = agree(env.world(), stage, step);
  if (!a.ok() && env.rank() == a.failed_rank && !a.reported) {
    log::error("{} failed{}: {}", stage, env.world_size() > 1 ? fmt::format(" on rank {}", env.rank()) : "", a.error);
  }
  return a.ok();
}

}  // namespace mgbench::runtime
