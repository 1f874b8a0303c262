#pragma once
// The run's energy readings (profile/telemetry.h, --telemetry): the sampler of this rank, opened when
// the training loop starts and closed when the run ends, and what the rank computed meanwhile, so
// that rank_<r>/energy gives joules per sample (per token for text) of exactly that span.
#include <cstdint>
#include <memory>

#include "profile/telemetry.h"
#include "results/writer.h"
#include "runtime/device.h"
#include "train/checkpoint/run_state.h"
#include "train/train_options.h"

namespace mgbench::train {

class TelemetryWindow {
 public:
  /// The sampler --telemetry asks for on a rank placed at `placement`, one of `ranks_on_node` on its
  /// node; nothing with --telemetry off. auto: NVML for a GPU rank, RAPL for a CPU rank, and a rank
  /// without a readable counter records "none" (local rank 0 logs why). Throws ConfigError when
  /// nvml or rapl was asked for by name and cannot be read (naming --telemetry and the reason), or
  /// nvml on a CPU rank.
  void open(const TrainOptions& options, const runtime::DevicePlacement& placement, int ranks_on_node, bool logs);
  /// Whether the run has telemetry tables (results::RankLayout::telemetry).
  bool enabled() const { return sampler_ != nullptr; }
  /// Takes the first reading; `run` where the run stands (a resumed run counts from here).
  void start(const RunProgress& run);
  /// Takes the last reading and writes rank_<r>/energy and rank_<r>/telemetry (independent).
  void write(const RunProgress& run, results::ResultsWriter& writer);

 private:
  std::unique_ptr<profile::TelemetrySampler> sampler_;
  std::int64_t first_samples_ = 0;
  std::int64_t first_tokens_ = 0;
};

}  // namespace mgbench::train
