#include "profile/telemetry.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

namespace mgbench::profile {
namespace {

constexpr options::Choice<TelemetryRequest> kTelemetry[] = {
    {"auto", TelemetryRequest::kAuto,
     "NVML for a GPU rank, RAPL for a CPU rank; a rank without a readable counter records \"none\""},
    {"nvml", TelemetryRequest::kNvml, "the rank's GPU through NVML (an error on a CPU rank or without NVML)"},
    {"rapl", TelemetryRequest::kRapl,
     "the node's CPU packages through Linux powercap (an error without a readable counter)"},
    {"off", TelemetryRequest::kOff, "no energy readings (no rank_<r>/energy table)"},
};

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// The larger of a and b, a NaN counting as absent.
double max_present(double a, double b) { return std::isnan(a) ? b : std::isnan(b) ? a : std::max(a, b); }

}  // namespace

std::span<const options::Choice<TelemetryRequest>> telemetry_choices() { return kTelemetry; }

TelemetrySampler::TelemetrySampler(std::unique_ptr<TelemetrySource> source, double interval_s, std::int64_t max_rows)
    : source_(std::move(source)), interval_s_(interval_s), max_rows_(std::max<std::int64_t>(max_rows, 2)) {}

TelemetrySampler::~TelemetrySampler() { stop(); }

void TelemetrySampler::read_and_add() {
  // The reading's time: the middle of the read, which may take milliseconds (NVML).
  const double before = seconds_now();
  const TelemetryReading reading = source_->read();
  add(0.5 * (before + seconds_now()), reading);
}

void TelemetrySampler::start() {
  if (!source_ || thread_.joinable()) return;
  read_and_add();
  thread_ = std::thread([this] { run(); });
}

void TelemetrySampler::stop() {
  if (!thread_.joinable()) return;
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  read_and_add();
}

void TelemetrySampler::run() {
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::duration<double>(interval_s_), [this] { return stopping_; })) {
    lock.unlock();  // a reading may take milliseconds (NVML): not under the lock
    read_and_add();
    lock.lock();
  }
}

void TelemetrySampler::add(double t_s, const TelemetryReading& reading) {
  const std::lock_guard lock(mutex_);
  if (readings_ == 0) {
    first_ = reading;
    first_t_ = t_s;
  } else {
    const double dt = t_s - last_t_;
    // An interval belongs to the reasons read at its start.
    if ((last_.throttle_reasons & kThrottleReasonsMask) != 0) throttled_s_ += dt;
    if (std::isfinite(last_.power_w) && std::isfinite(reading.power_w)) {
      integrated_j_ += 0.5 * (last_.power_w + reading.power_w) * dt;
    } else {
      power_integrable_ = false;
    }
  }
  max_power_w_ = max_present(max_power_w_, reading.power_w);
  max_temperature_c_ = max_present(max_temperature_c_, reading.temperature_c);
  if (std::isfinite(reading.sm_clock_mhz)) sm_clock_sum_ += reading.sm_clock_mhz, ++sm_clock_n_;
  if (std::isfinite(reading.mem_clock_mhz)) mem_clock_sum_ += reading.mem_clock_mhz, ++mem_clock_n_;
  last_ = reading;
  last_t_ = t_s;
  const bool kept = readings_ % keep_every_ == 0;
  ++readings_;
  if (!kept) return;
  if (static_cast<std::int64_t>(rows_.size()) == max_rows_) {
    // Full: keep rows 0, 2, 4, ... and from now on every reading of twice the spacing.
    std::size_t n = 0;
    for (std::size_t i = 0; i < rows_.size(); i += 2) rows_[n++] = rows_[i];
    rows_.resize(n);
    keep_every_ *= 2;
    if ((readings_ - 1) % keep_every_ != 0) return;
  }
  const double counter = reading.energy_j - first_.energy_j;
  rows_.push_back({t_s - first_t_,
                   std::isfinite(counter) ? counter
                   : power_integrable_    ? integrated_j_
                                          : results::kNaN,
                   reading.power_w, reading.sm_clock_mhz, reading.mem_clock_mhz, reading.temperature_c,
                   reading.throttle_reasons});
}

results::EnergyRecord TelemetrySampler::energy() const {
  const std::lock_guard lock(mutex_);
  results::EnergyRecord e;
  const char* name = source_ ? source_->name() : "none";
  std::strncpy(e.source, name, sizeof(e.source) - 1);
  e.node_share = source_ ? source_->node_share() : 1.0;
  e.readings = readings_;
  if (readings_ == 0) return e;
  e.span_s = last_t_ - first_t_;
  const double counter = last_.energy_j - first_.energy_j;
  e.energy_j = std::isfinite(counter) ? counter : power_integrable_ && readings_ > 1 ? integrated_j_ : results::kNaN;
  e.mean_power_w = e.span_s > 0 ? e.energy_j / e.span_s : results::kNaN;
  e.max_power_w = max_power_w_;
  e.mean_sm_clock_mhz = sm_clock_n_ > 0 ? sm_clock_sum_ / static_cast<double>(sm_clock_n_) : results::kNaN;
  e.mean_mem_clock_mhz = mem_clock_n_ > 0 ? mem_clock_sum_ / static_cast<double>(mem_clock_n_) : results::kNaN;
  e.max_temperature_c = max_temperature_c_;
  e.throttled_s = source_ && source_->reads_slowdowns() ? throttled_s_ : results::kNaN;
  return e;
}

std::vector<results::TelemetryRecord> TelemetrySampler::readings() const {
  const std::lock_guard lock(mutex_);
  return rows_;
}

}  // namespace mgbench::profile
