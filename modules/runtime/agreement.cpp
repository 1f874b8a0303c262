#include "runtime/agreement.h"

#include <exception>
#include <string>

#include <fmt/format.h>

#include "core/log.h"

namespace mgbench::runtime {

bool all_succeed(const MpiEnvironment& env, std::string_view stage, const std::function<void()>& step) {
  std::string error;
  try {
    step();
  } catch (const std::exception& e) {
    error = e.what();
  }
  const int first_failing = env.first_failing_rank(error.empty());
  if (first_failing < 0) return true;
  if (env.rank() == first_failing) {
    log::error("{} failed{}: {}", stage, env.world_size() > 1 ? fmt::format(" on rank {}", env.rank()) : "", error);
  }
  return false;
}

}  // namespace mgbench::runtime
