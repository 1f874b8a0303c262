#include "profile/profile_window.h"

#include <cstdlib>

#include <fmt/format.h>

#include "core/error.h"

namespace mgbench::profile {
namespace {

double parse_number(const std::string& text, const std::string& whole) {
  if (text.empty()) return 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  MGBENCH_REQUIRE(end != text.c_str() && *end == '\0' && v >= 0, ConfigError,
                  "--profile-window '{}': '{}' is not a non-negative number (expected START:DURATION in seconds, "
                  "steps:FIRST:COUNT, or all)",
                  whole, text);
  return v;
}

}  // namespace

bool ProfileWindow::contains(double elapsed_s, std::int64_t step) const {
  if (by_steps) return step >= first_step && (steps <= 0 || step < first_step + steps);
  return elapsed_s >= start_s && (duration_s <= 0 || elapsed_s < start_s + duration_s);
}

std::string ProfileWindow::describe() const {
  if (by_steps) {
    return steps > 0 ? fmt::format("steps {}-{}", first_step, first_step + steps - 1)
                     : fmt::format("steps {}-end", first_step);
  }
  if (start_s == 0 && duration_s <= 0) return "whole run";
  return duration_s > 0 ? fmt::format("{:g}:{:g} s", start_s, duration_s) : fmt::format("{:g} s-end", start_s);
}

ProfileWindow parse_profile_window(const std::string& text) {
  ProfileWindow w;
  if (text.empty() || text == "all") return w;
  if (text.rfind("steps:", 0) == 0) {
    const std::string rest = text.substr(6);
    const auto colon = rest.find(':');
    w.by_steps = true;
    const double first = parse_number(rest.substr(0, colon), text);
    const double count = colon == std::string::npos ? 0 : parse_number(rest.substr(colon + 1), text);
    w.first_step = static_cast<std::int64_t>(first);
    w.steps = static_cast<std::int64_t>(count);
    MGBENCH_REQUIRE(static_cast<double>(w.first_step) == first && static_cast<double>(w.steps) == count, ConfigError,
                    "--profile-window '{}': step numbers must be whole", text);
    return w;
  }
  const auto colon = text.find(':');
  MGBENCH_REQUIRE(colon != std::string::npos, ConfigError,
                  "--profile-window '{}': expected START:DURATION in seconds (e.g. 0:720), steps:FIRST:COUNT, or all",
                  text);
  w.start_s = parse_number(text.substr(0, colon), text);
  w.duration_s = parse_number(text.substr(colon + 1), text);
  return w;
}

}  // namespace mgbench::profile
