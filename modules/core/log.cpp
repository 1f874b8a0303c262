#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <fmt/format.h>

namespace mgbench::log {

void init(int rank, int world_size, bool verbose) {
  auto logger = spdlog::stderr_color_mt("mgbench");
  const std::string prefix = world_size > 1 ? fmt::format("[rank {}/{}] ", rank, world_size) : std::string();
  logger->set_pattern("%^%L%$ %H:%M:%S " + prefix + "%v");
  if (verbose) {
    logger->set_level(spdlog::level::debug);
  } else {
    logger->set_level(rank == 0 ? spdlog::level::info : spdlog::level::warn);
  }
  spdlog::set_default_logger(logger);
}

}  // namespace mgbench::log
