#include "core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

#include "core/timer.h"

namespace mgbench {

std::string utc_now(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  return std::strftime(buf, sizeof(buf), format, &tm) > 0 ? buf : "";
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--:--";
  const auto s = static_cast<long long>(seconds + 0.5);
  return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
}

Progress::Progress(bool enabled, std::string unit, double interval_s, std::FILE* out)
    : enabled_(enabled),
      live_(enabled && isatty(fileno(out)) != 0),
      unit_(std::move(unit)),
      interval_s_(interval_s),
      out_(out) {}

void Progress::update(const ProgressState& s) {
  if (!enabled_) return;
  const double t = now_s();
  const bool last_step = s.step == s.steps;
  const double min_gap = live_ ? 0.1 : interval_s_;
  if (t - last_draw_s_ < min_gap && !(live_ && last_step)) return;
  last_draw_s_ = t;
  draw(s);
}

void Progress::draw(const ProgressState& s) {
  const std::string stats = fmt::format("loss {:.4f} | {:.1f} {} | elapsed {} | ETA {}", s.loss, s.samples_per_s, unit_,
                                        format_duration(s.elapsed_s), format_duration(s.eta_s));
  if (live_) {
    constexpr int kWidth = 24;
    const double frac = s.steps > 0 ? static_cast<double>(s.step) / static_cast<double>(s.steps) : 0.0;
    const int filled = std::clamp(static_cast<int>(frac * kWidth), 0, kWidth);
    fmt::print(out_, "\r\033[2Kepoch {}/{} [{}{}] {}/{} | {}", s.epoch, s.epochs, std::string(filled, '#'),
               std::string(kWidth - filled, '.'), s.step, s.steps, stats);
    line_open_ = true;
  } else {
    fmt::print(out_, "epoch {}/{} step {}/{} | {}\n", s.epoch, s.epochs, s.step, s.steps, stats);
  }
  std::fflush(out_);
}

void Progress::message(const std::string& line) {
  if (!enabled_) return;
  if (line_open_) {
    fmt::print(out_, "\n");
    line_open_ = false;
  }
  fmt::print(out_, "{}\n", line);
  std::fflush(out_);
}

}  // namespace mgbench
