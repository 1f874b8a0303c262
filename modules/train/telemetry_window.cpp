#include "train/telemetry_window.h"

#include "core/error.h"
#include "core/log.h"

namespace mgbench::train {

void TelemetryWindow::open(const TrainOptions& options, const runtime::DevicePlacement& placement, int ranks_on_node,
                           bool logs) {
  using profile::TelemetryRequest;
  const TelemetryRequest request = options.telemetry;
  if (request == TelemetryRequest::kOff) return;
  const bool nvml = request == TelemetryRequest::kNvml || (request == TelemetryRequest::kAuto && placement.is_cuda());
  MGBENCH_REQUIRE(!nvml || placement.is_cuda(), ConfigError,
                  "--telemetry nvml: this rank computes on the CPU (use rapl, auto or off)");
  std::string why_not;
  std::unique_ptr<profile::TelemetrySource> source =
      nvml ? profile::open_nvml(runtime::cuda_pci_bus_id(placement.index), why_not)
           : profile::open_rapl(ranks_on_node, why_not);
  MGBENCH_REQUIRE(source || request == TelemetryRequest::kAuto, ConfigError, "--telemetry {}: {}",
                  nvml ? "nvml" : "rapl", why_not);
  if (!source && logs) log::info("energy: no energy counter on this node ({})", why_not);
  sampler_ = std::make_unique<profile::TelemetrySampler>(std::move(source), options.telemetry_interval_ms / 1e3);
}

void TelemetryWindow::start(const RunProgress& run) {
  if (!sampler_) return;
  first_samples_ = run.computed_samples;
  first_tokens_ = run.real_tokens;
  sampler_->start();
}

void TelemetryWindow::write(const RunProgress& run, results::ResultsWriter& writer) {
  if (!sampler_) return;
  sampler_->stop();
  results::EnergyRecord energy = sampler_->energy();
  energy.samples = run.computed_samples - first_samples_;
  energy.tokens = run.real_tokens - first_tokens_;
  writer.write_telemetry(energy, sampler_->readings());
}

}  // namespace mgbench::train
