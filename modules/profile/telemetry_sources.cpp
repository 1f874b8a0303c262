// The energy sources of profile/telemetry.h: NVML, loaded at run time, and Linux powercap's RAPL.
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include <fmt/format.h>

#include "profile/telemetry.h"

namespace mgbench::profile {
namespace {

// --- NVML ------------------------------------------------------------------------------------------
// The few NVML entry points the sampler calls, declared from NVML's API reference (nvml.h of the
// CUDA toolkit's NVML development files; the signatures are the driver's stable ABI): every call
// returns nvmlReturn_t, 0 = NVML_SUCCESS.
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr unsigned kNvmlClockSm = 1;         // NVML_CLOCK_SM
constexpr unsigned kNvmlClockMem = 2;        // NVML_CLOCK_MEM
constexpr unsigned kNvmlTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU

struct NvmlApi {
  NvmlReturn (*init)() = nullptr;                                          // nvmlInit_v2
  NvmlReturn (*shutdown)() = nullptr;                                      // nvmlShutdown
  const char* (*error_string)(NvmlReturn) = nullptr;                       // nvmlErrorString
  NvmlReturn (*handle_by_bus_id)(const char*, NvmlDevice*) = nullptr;      // nvmlDeviceGetHandleByPciBusId_v2
  NvmlReturn (*total_energy)(NvmlDevice, unsigned long long*) = nullptr;   // nvmlDeviceGetTotalEnergyConsumption [mJ]
  NvmlReturn (*power_usage)(NvmlDevice, unsigned*) = nullptr;              // nvmlDeviceGetPowerUsage [mW]
  NvmlReturn (*clock_info)(NvmlDevice, unsigned, unsigned*) = nullptr;     // nvmlDeviceGetClockInfo [MHz]
  NvmlReturn (*temperature)(NvmlDevice, unsigned, unsigned*) = nullptr;    // nvmlDeviceGetTemperature [C]
  NvmlReturn (*clock_reasons)(NvmlDevice, unsigned long long*) = nullptr;  // ...ClocksEventReasons (R535+),
                                                                           // else ...ClocksThrottleReasons
};

template <typename F>
bool resolve(void* library, const char* symbol, F& fn) {
  fn = reinterpret_cast<F>(dlsym(library, symbol));
  return fn != nullptr;
}

class NvmlSource final : public TelemetrySource {
 public:
  NvmlSource(const NvmlApi& api, NvmlDevice device) : api_(api), device_(device) {}
  ~NvmlSource() override { api_.shutdown(); }  // the library stays loaded: NVML's threads may outlive a dlclose
  const char* name() const override { return "nvml"; }
  bool reads_slowdowns() const override { return true; }

  TelemetryReading read() override {
    TelemetryReading r;
    unsigned long long energy_mj = 0;
    if (api_.total_energy && api_.total_energy(device_, &energy_mj) == 0)
      r.energy_j = static_cast<double>(energy_mj) / 1e3;
    unsigned value = 0;
    if (api_.power_usage(device_, &value) == 0) r.power_w = value / 1e3;
    if (api_.clock_info(device_, kNvmlClockSm, &value) == 0) r.sm_clock_mhz = value;
    if (api_.clock_info(device_, kNvmlClockMem, &value) == 0) r.mem_clock_mhz = value;
    if (api_.temperature(device_, kNvmlTemperatureGpu, &value) == 0) r.temperature_c = value;
    unsigned long long reasons = 0;
    if (api_.clock_reasons && api_.clock_reasons(device_, &reasons) == 0) r.throttle_reasons = reasons;
    return r;
  }

 private:
  NvmlApi api_;
  NvmlDevice device_;
};

// --- RAPL ------------------------------------------------------------------------------------------

/// One package domain's counter [µJ] and where it wraps.
struct RaplDomain {
  std::filesystem::path energy_file;
  double wrap_uj = 0;  // max_energy_range_uj + 1 (0: unknown, no wrap undone)
  double last_uj = 0;
  double total_uj = 0;  // since the source opened
};

bool read_number(const std::filesystem::path& file, double& value) {
  std::ifstream in(file);
  return static_cast<bool>(in >> value);
}

class RaplSource final : public TelemetrySource {
 public:
  RaplSource(std::vector<RaplDomain> domains, int ranks_on_node)
      : domains_(std::move(domains)), share_(1.0 / std::max(ranks_on_node, 1)) {}
  const char* name() const override { return "rapl"; }
  double node_share() const override { return share_; }

  TelemetryReading read() override {
    TelemetryReading r;
    double total = 0;
    for (RaplDomain& d : domains_) {
      double now = 0;
      if (!read_number(d.energy_file, now)) return r;  // energy NaN: this reading has no counter
      double delta = now - d.last_uj;
      if (delta < 0 && d.wrap_uj > 0) delta += d.wrap_uj;
      d.total_uj += std::max(delta, 0.0);
      d.last_uj = now;
      total += d.total_uj;
    }
    r.energy_j = total / 1e6;
    return r;
  }

 private:
  std::vector<RaplDomain> domains_;
  double share_;
};

}  // namespace

std::unique_ptr<TelemetrySource> open_nvml(const std::string& pci_bus_id, std::string& why_not) {
  const char* override_path = std::getenv("MGBENCH_NVML_LIBRARY");
  const std::string file = override_path != nullptr && *override_path != '\0' ? override_path : "libnvidia-ml.so.1";
  void* library = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    why_not = error != nullptr ? error : file + ": cannot be loaded";
    return nullptr;
  }
  NvmlApi api;
  const bool found = resolve(library, "nvmlInit_v2", api.init) && resolve(library, "nvmlShutdown", api.shutdown) &&
                     resolve(library, "nvmlErrorString", api.error_string) &&
                     resolve(library, "nvmlDeviceGetHandleByPciBusId_v2", api.handle_by_bus_id) &&
                     resolve(library, "nvmlDeviceGetPowerUsage", api.power_usage) &&
                     resolve(library, "nvmlDeviceGetClockInfo", api.clock_info) &&
                     resolve(library, "nvmlDeviceGetTemperature", api.temperature);
  if (!found) {
    why_not = fmt::format("{}: an NVML entry point is missing ({})", file, dlerror());
    return nullptr;
  }
  // Optional: energy before Volta is power integrated; the reasons' name changed in R535.
  resolve(library, "nvmlDeviceGetTotalEnergyConsumption", api.total_energy);
  if (!resolve(library, "nvmlDeviceGetCurrentClocksEventReasons", api.clock_reasons)) {
    resolve(library, "nvmlDeviceGetCurrentClocksThrottleReasons", api.clock_reasons);
  }
  if (const NvmlReturn status = api.init(); status != 0) {
    why_not = fmt::format("{}: nvmlInit_v2: {}", file, api.error_string(status));
    return nullptr;
  }
  NvmlDevice device = nullptr;
  if (const NvmlReturn status = api.handle_by_bus_id(pci_bus_id.c_str(), &device); status != 0) {
    why_not = fmt::format("{}: no NVML device at PCI bus id '{}': {}", file, pci_bus_id, api.error_string(status));
    api.shutdown();
    return nullptr;
  }
  return std::make_unique<NvmlSource>(api, device);
}

std::unique_ptr<TelemetrySource> open_rapl(int ranks_on_node, std::string& why_not) {
  const char* override_root = std::getenv("MGBENCH_POWERCAP_ROOT");
  const std::filesystem::path root =
      override_root != nullptr && *override_root != '\0' ? override_root : "/sys/class/powercap";
  std::error_code error;
  std::vector<RaplDomain> domains;
  const std::regex package("intel-rapl:[0-9]+");  // a package; its sub-domains (core, dram) are intel-rapl:<n>:<m>
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    if (!std::regex_match(entry.path().filename().string(), package)) continue;
    RaplDomain d{entry.path() / "energy_uj"};
    if (!read_number(d.energy_file, d.last_uj)) {
      why_not = fmt::format("{}: not readable (RAPL counters are root-only since Linux 5.10)", d.energy_file.string());
      return nullptr;
    }
    if (read_number(entry.path() / "max_energy_range_uj", d.wrap_uj)) d.wrap_uj += 1;
    domains.push_back(std::move(d));
  }
  if (domains.empty()) {
    why_not = fmt::format("{}: no RAPL package domain (intel-rapl:<n>)", root.string());
    return nullptr;
  }
  std::sort(domains.begin(), domains.end(),
            [](const RaplDomain& a, const RaplDomain& b) { return a.energy_file < b.energy_file; });
  return std::make_unique<RaplSource>(std::move(domains), ranks_on_node);
}

}  // namespace mgbench::profile
