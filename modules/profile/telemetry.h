#pragma once
// Energy, power and clocks per rank (issue 49): the rank's GPU through NVML, or the node's CPU
// packages through RAPL (Linux powercap), read on a thread of each rank every --telemetry-interval
// and summarised into the results file (rank_<r>/energy, rank_<r>/telemetry). An HPC centre asks
// for joules per sample as often as for seconds. No LibTorch and no CUDA here: libnvidia-ml is
// loaded at run time (dlopen), so a build needs no driver and a node without one says "no energy
// counter" instead of failing.
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/option_table.h"
#include "results/schema.h"

namespace mgbench::profile {

/// --telemetry: where a rank reads its energy.
enum class TelemetryRequest { kAuto, kNvml, kRapl, kOff };
std::span<const options::Choice<TelemetryRequest>> telemetry_choices();

/// One reading of an energy source; NaN where the source does not offer the value.
struct TelemetryReading {
  double energy_j = results::kNaN;  // the source's energy counter, wraps undone [J] (any origin)
  double power_w = results::kNaN;
  double sm_clock_mhz = results::kNaN;
  double mem_clock_mhz = results::kNaN;
  double temperature_c = results::kNaN;
  std::uint64_t throttle_reasons = 0;  // NVML's clocks event reasons (bit mask)
};

/// The clocks event reasons that slow the GPU down (NVML, nvml.h: SwPowerCap 0x4, HW_SLOWDOWN 0x8,
/// SW_THERMAL 0x20, HW_THERMAL 0x40, HW_POWER_BRAKE 0x80). GpuIdle (0x1), the applications-clocks
/// setting (0x2), SyncBoost (0x10) and the display clock (0x100) are not counted as throttling.
inline constexpr std::uint64_t kThrottleReasonsMask = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;

class TelemetrySource {
 public:
  virtual ~TelemetrySource() = default;
  /// "nvml" or "rapl": EnergyRecord::source.
  virtual const char* name() const = 0;
  /// The share of the counter this rank accounts for (EnergyRecord::node_share): 1 for a GPU.
  virtual double node_share() const { return 1.0; }
  /// Whether read() reports slowdown reasons (throttle_reasons): NVML does; a source that does not
  /// (RAPL) leaves the time throttled unknown (NaN), not 0.
  virtual bool reads_slowdowns() const { return false; }
  /// Reads the counters now. Never throws: a value that cannot be read is NaN.
  virtual TelemetryReading read() = 0;
};

/// The NVML source of the GPU with PCI bus id `pci_bus_id` ("0000:65:00.0": NVML and CUDA number
/// devices differently, the bus id is the same), from libnvidia-ml.so.1 loaded at run time
/// (MGBENCH_NVML_LIBRARY names another file: a test's stand-in). Energy: nvmlDeviceGetTotalEnergyConsumption
/// (mJ, Volta and later), else power integrated over time by the sampler. nullptr with `why_not`
/// ("libnvidia-ml.so.1: cannot open shared object file", "nvmlInit_v2: ...") when unavailable.
std::unique_ptr<TelemetrySource> open_nvml(const std::string& pci_bus_id, std::string& why_not);

/// The RAPL source of this node: the package domains (intel-rapl:<n>, also AMD's since Linux 5.8)
/// under /sys/class/powercap (MGBENCH_POWERCAP_ROOT names another directory: a test's stand-in),
/// each counter's wrap at max_energy_range_uj undone. The node's energy, shared by the
/// `ranks_on_node` ranks that read it (node_share 1 / ranks_on_node). nullptr with `why_not` when
/// there is no package domain or its energy_uj is not readable (root only since Linux 5.10).
std::unique_ptr<TelemetrySource> open_rapl(int ranks_on_node, std::string& why_not);

/// Reads a source every `interval_s` on a thread of its own from start() to stop(), and sums the
/// readings into an EnergyRecord: energy as the counter's difference (else power integrated by the
/// trapezoid rule), mean and largest power, mean clocks, the largest temperature, and the time with
/// a slowdown reason set. Keeps at most `max_rows` readings for rank_<r>/telemetry: when full, every
/// second kept reading is dropped and from then on every other one is kept, so the rows span the
/// run; the summary uses every reading. A null source makes the record of a rank without an energy
/// counter (source "none", no readings).
class TelemetrySampler {
 public:
  TelemetrySampler(std::unique_ptr<TelemetrySource> source, double interval_s,
                   std::int64_t max_rows = results::kTelemetryRows);
  ~TelemetrySampler();
  TelemetrySampler(const TelemetrySampler&) = delete;
  TelemetrySampler& operator=(const TelemetrySampler&) = delete;

  /// Takes the first reading now and starts the thread (nothing with a null source).
  void start();
  /// Takes the last reading now and joins the thread; a second call does nothing.
  void stop();
  /// Adds a reading taken `t_s` seconds after an arbitrary origin (the thread's path; tests call it
  /// directly to drive the summary without a clock).
  void add(double t_s, const TelemetryReading& reading);
  /// The summary so far (samples and tokens left 0: the caller's counts).
  results::EnergyRecord energy() const;
  /// The readings kept, t_s and energy_j from the first reading.
  std::vector<results::TelemetryRecord> readings() const;

 private:
  /// Reads the source once and adds the reading, timed at the middle of the read.
  void read_and_add();
  void run();

  std::unique_ptr<TelemetrySource> source_;
  double interval_s_;
  std::int64_t max_rows_;
  std::thread thread_;
  std::condition_variable wake_;
  bool stopping_ = false;
  mutable std::mutex mutex_;
  // The summary's sums, under mutex_.
  std::int64_t readings_ = 0;
  std::int64_t keep_every_ = 1;
  TelemetryReading first_, last_;
  double first_t_ = results::kNaN, last_t_ = results::kNaN;
  double integrated_j_ = 0;
  bool power_integrable_ = true;
  double max_power_w_ = results::kNaN, max_temperature_c_ = results::kNaN;
  double sm_clock_sum_ = 0, mem_clock_sum_ = 0;
  std::int64_t sm_clock_n_ = 0, mem_clock_n_ = 0;
  double throttled_s_ = 0;
  std::vector<results::TelemetryRecord> rows_;
};

}  // namespace mgbench::profile
