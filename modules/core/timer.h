#pragma once
// Wall-clock time helpers (steady clock, seconds as double).
#include <chrono>
#include <string>

namespace mgbench {

/// Seconds since an arbitrary, fixed origin (std::chrono::steady_clock).
inline double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

/// Measures elapsed wall time since construction or the last lap().
class Stopwatch {
 public:
  Stopwatch() : start_s_(now_s()) {}
  /// Seconds since construction or the previous lap(); restarts the watch.
  double lap() {
    const double t = now_s();
    const double dt = t - start_s_;
    start_s_ = t;
    return dt;
  }
  /// Seconds since construction or the previous lap(); does not restart.
  double elapsed() const { return now_s() - start_s_; }

 private:
  double start_s_;
};

/// The current UTC time in a strftime format: "%Y-%m-%dT%H:%M:%SZ" (ISO 8601, the default:
/// "2026-11-21T09:30:00Z"), "%Y%m%dT%H%M%SZ" (its basic form, for names: run ids).
std::string utc_now(const char* format = "%Y-%m-%dT%H:%M:%SZ");

/// utc_now() as ISO 8601 (run attributes, manifests).
inline std::string utc_now_iso8601() { return utc_now(); }

}  // namespace mgbench
