// Energy telemetry (profile/telemetry.h): the sampler's summary against readings worked by hand, the
// RAPL counter's wrap over a stand-in powercap tree, and the NVML path through dlopen of a stand-in
// libnvidia-ml (tests/unit/fake_nvml.c: one GPU at a constant 300 W), the results file's energy
// tables written and read back, and report --energy's J/sample.
#include <mpi.h>
#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "profile/telemetry.h"
#include "report/report.h"
#include "results/reader.h"
#include "results/writer.h"
#include "test_paths.h"
#include "test_support.h"

namespace mgbench::profile {
namespace {

TelemetryReading reading(double energy_j, double power_w, std::uint64_t reasons = 0) {
  TelemetryReading r;
  r.energy_j = energy_j;
  r.power_w = power_w;
  r.sm_clock_mhz = 1000 + power_w;
  r.mem_clock_mhz = 2619;
  r.temperature_c = power_w / 10;
  r.throttle_reasons = reasons;
  return r;
}

/// A source that returns nothing (the sampler is driven through add()); `slowdowns`: whether it
/// reports slowdown reasons, as NVML does.
class NamedSource final : public TelemetrySource {
 public:
  NamedSource(const char* name, bool slowdowns) : name_(name), slowdowns_(slowdowns) {}
  const char* name() const override { return name_; }
  bool reads_slowdowns() const override { return slowdowns_; }
  TelemetryReading read() override { return {}; }

 private:
  const char* name_;
  bool slowdowns_;
};

TEST(Telemetry, SummaryIsTheCounterDifferenceAndTheSlowedTime) {
  TelemetrySampler sampler(std::make_unique<NamedSource>("nvml", true), 0.1);
  sampler.add(10.0, reading(1000, 100, 0x1));  // idle: not throttled
  sampler.add(11.0, reading(1150, 200, 0x4));  // power cap: the next second is throttled
  sampler.add(12.5, reading(1450, 200, 0x40 | 0x1));
  sampler.add(13.0, reading(1600, 300));
  const results::EnergyRecord e = sampler.energy();
  EXPECT_STREQ(e.source, "nvml");
  EXPECT_EQ(e.readings, 4);
  EXPECT_DOUBLE_EQ(e.span_s, 3.0);
  EXPECT_DOUBLE_EQ(e.energy_j, 600.0);
  EXPECT_DOUBLE_EQ(e.mean_power_w, 200.0);
  EXPECT_DOUBLE_EQ(e.max_power_w, 300.0);
  EXPECT_DOUBLE_EQ(e.max_temperature_c, 30.0);
  EXPECT_DOUBLE_EQ(e.mean_sm_clock_mhz, 1000 + 200.0);
  EXPECT_DOUBLE_EQ(e.throttled_s, 1.5 + 0.5);  // [11, 12.5) and [12.5, 13)
  const auto rows = sampler.readings();
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_DOUBLE_EQ(rows[0].t_s, 0.0);
  EXPECT_DOUBLE_EQ(rows[2].t_s, 2.5);
  EXPECT_DOUBLE_EQ(rows[2].energy_j, 450.0);
  EXPECT_EQ(rows[2].throttle_reasons, 0x41u);
}

TEST(Telemetry, WithoutACounterPowerIsIntegratedByTheTrapezoidRule) {
  TelemetrySampler sampler(std::make_unique<NamedSource>("nvml", true), 0.1);
  const double nan = results::kNaN;
  sampler.add(0.0, reading(nan, 100));
  sampler.add(1.0, reading(nan, 200));
  sampler.add(3.0, reading(nan, 200));
  const results::EnergyRecord e = sampler.energy();
  EXPECT_DOUBLE_EQ(e.energy_j, 150.0 + 400.0);
  EXPECT_DOUBLE_EQ(sampler.readings()[1].energy_j, 150.0);
  // A gap in the power readings leaves the energy unknown, not smaller.
  sampler.add(4.0, reading(nan, nan));
  EXPECT_TRUE(std::isnan(sampler.energy().energy_j));
}

TEST(Telemetry, FullTablesKeepEveryOtherReadingSoTheRowsSpanTheRun) {
  TelemetrySampler sampler(std::make_unique<NamedSource>("rapl", false), 0.1, /*max_rows=*/4);
  for (int k = 0; k < 10; ++k) sampler.add(k, reading(10.0 * k, 10));
  std::vector<double> times;
  for (const auto& row : sampler.readings()) times.push_back(row.t_s);
  EXPECT_EQ(times, (std::vector<double>{0, 4, 8}));
  const results::EnergyRecord e = sampler.energy();
  EXPECT_EQ(e.readings, 10);  // the summary is over every reading
  EXPECT_DOUBLE_EQ(e.energy_j, 90.0);
  EXPECT_TRUE(std::isnan(e.throttled_s));  // RAPL has no slowdown reasons
}

TEST(Telemetry, ARankWithoutACounterRecordsNone) {
  TelemetrySampler sampler(nullptr, 0.1);
  sampler.start();
  sampler.stop();
  const results::EnergyRecord e = sampler.energy();
  EXPECT_STREQ(e.source, "none");
  EXPECT_EQ(e.readings, 0);
  EXPECT_TRUE(std::isnan(e.energy_j));
  EXPECT_TRUE(sampler.readings().empty());
}

void write_text(const std::filesystem::path& file, const std::string& text) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file) << text << "\n";
}

/// Sets an environment variable for one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) { setenv(name, value.c_str(), 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

TEST(Telemetry, RaplSumsThePackagesAndUndoesTheirWrap) {
  test::TempDir dir;
  const std::filesystem::path root = dir.path();
  write_text(root / "intel-rapl:0" / "energy_uj", "1000");
  write_text(root / "intel-rapl:0" / "max_energy_range_uj", "9999");
  write_text(root / "intel-rapl:0:0" / "energy_uj", "777");  // a core sub-domain: inside package 0
  write_text(root / "intel-rapl:1" / "energy_uj", "0");
  write_text(root / "intel-rapl:1" / "max_energy_range_uj", "9999");
  const ScopedEnv env("MGBENCH_POWERCAP_ROOT", root.string());
  std::string why_not;
  auto rapl = open_rapl(/*ranks_on_node=*/2, why_not);
  ASSERT_TRUE(rapl) << why_not;
  EXPECT_STREQ(rapl->name(), "rapl");
  EXPECT_DOUBLE_EQ(rapl->node_share(), 0.5);
  EXPECT_DOUBLE_EQ(rapl->read().energy_j, 0.0);
  write_text(root / "intel-rapl:0" / "energy_uj", "9000");
  write_text(root / "intel-rapl:1" / "energy_uj", "500");
  EXPECT_DOUBLE_EQ(rapl->read().energy_j, (8000 + 500) / 1e6);
  write_text(root / "intel-rapl:0" / "energy_uj", "1000");  // wrapped at 10000: 2000 more
  EXPECT_DOUBLE_EQ(rapl->read().energy_j, (10000 + 500) / 1e6);

  std::filesystem::remove_all(root / "intel-rapl:0");
  std::filesystem::remove_all(root / "intel-rapl:1");
  EXPECT_FALSE(open_rapl(1, why_not));
  EXPECT_NE(why_not.find("no RAPL package domain"), std::string::npos) << why_not;
}

std::string fake_nvml() {
  return (std::filesystem::path(test::paths::test_binary_dir()) / "libmgbench_fake_nvml.so").string();
}

TEST(Telemetry, NvmlThroughDlopenReadsTheDeviceOfTheBusId) {
  const ScopedEnv env("MGBENCH_NVML_LIBRARY", fake_nvml());
  std::string why_not;
  EXPECT_FALSE(open_nvml("0000:17:00.0", why_not));
  EXPECT_NE(why_not.find("no NVML device at PCI bus id '0000:17:00.0': Not Found"), std::string::npos) << why_not;
  auto nvml = open_nvml("0000:65:00.0", why_not);
  ASSERT_TRUE(nvml) << why_not;
  const TelemetryReading r = nvml->read();
  EXPECT_DOUBLE_EQ(r.power_w, 300.0);
  EXPECT_DOUBLE_EQ(r.sm_clock_mhz, 1980.0);
  EXPECT_DOUBLE_EQ(r.mem_clock_mhz, 2619.0);
  EXPECT_DOUBLE_EQ(r.temperature_c, 61.0);
  EXPECT_EQ(r.throttle_reasons, 0x5u);
  EXPECT_GE(r.energy_j, 5000.0);

  // The thread: the stand-in's counter advances 6 J at every read, so the energy is the counter's
  // difference between the first and the last reading, 6 J x (readings - 1), and each row's the
  // counter since the first; the power the stand-in reports (300 W) is not integrated.
  TelemetrySampler sampler(std::move(nvml), 0.02);
  sampler.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  sampler.stop();
  const results::EnergyRecord e = sampler.energy();
  EXPECT_GE(e.readings, 3);
  EXPECT_GE(e.span_s, 0.5);
  EXPECT_DOUBLE_EQ(e.energy_j, 6.0 * static_cast<double>(e.readings - 1));
  EXPECT_DOUBLE_EQ(e.mean_power_w, e.energy_j / e.span_s);
  EXPECT_DOUBLE_EQ(e.max_power_w, 300.0);
  EXPECT_DOUBLE_EQ(e.throttled_s, e.span_s);  // the power cap, all along
  const auto rows = sampler.readings();
  ASSERT_EQ(static_cast<std::int64_t>(rows.size()), e.readings);
  for (std::size_t i = 0; i < rows.size(); ++i) EXPECT_DOUBLE_EQ(rows[i].energy_j, 6.0 * static_cast<double>(i));
}

TEST(Telemetry, NvmlWithoutAnEnergyCounterIntegratesPower) {
  const ScopedEnv env("MGBENCH_NVML_LIBRARY", fake_nvml());
  const ScopedEnv no_energy("FAKE_NVML_NO_ENERGY", "1");
  std::string why_not;
  auto nvml = open_nvml("0000:65:00.0", why_not);
  ASSERT_TRUE(nvml) << why_not;
  EXPECT_TRUE(std::isnan(nvml->read().energy_j));
  TelemetrySampler sampler(std::move(nvml), 0.02);
  sampler.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  sampler.stop();
  const results::EnergyRecord e = sampler.energy();
  EXPECT_NEAR(e.energy_j, 300.0 * e.span_s, 1e-9);
}

TEST(Telemetry, NvmlUnavailableSaysWhy) {
  std::string why_not;
  {
    const ScopedEnv env("MGBENCH_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1");
    EXPECT_FALSE(open_nvml("0000:65:00.0", why_not));
    EXPECT_NE(why_not.find("/nonexistent/libnvidia-ml.so.1"), std::string::npos) << why_not;
  }
  const ScopedEnv env("MGBENCH_NVML_LIBRARY", fake_nvml());
  const ScopedEnv fails("FAKE_NVML_INIT_FAILS", "1");
  EXPECT_FALSE(open_nvml("0000:65:00.0", why_not));
  EXPECT_NE(why_not.find("nvmlInit_v2: Driver Not Loaded"), std::string::npos) << why_not;
}

TEST(Telemetry, EnergyTablesRoundTripAndReportJoulesPerSample) {
  test::TempDir dir;
  const std::string path = dir.file("e.h5");
  results::RankLayout layout{1, 2, 0, false, {}, 0, /*telemetry=*/true};
  std::string run_id;
  {
    results::ResultsWriter writer(path, MPI_COMM_SELF, "energy", {{"task", std::string("image")}}, {}, layout);
    TelemetrySampler sampler(std::make_unique<NamedSource>("nvml", true), 0.1);
    sampler.add(0.0, reading(0, 250));
    sampler.add(2.0, reading(500, 250, 0x4));
    sampler.add(4.0, reading(1000, 250));
    results::EnergyRecord energy = sampler.energy();
    energy.samples = 400;
    writer.write_telemetry(energy, sampler.readings());
    run_id = writer.run_id();
    writer.finish(results::kStatusCompleted);
  }
  const auto runs = results::read_runs(path);
  ASSERT_EQ(runs.size(), 1u);
  ASSERT_EQ(runs[0].energy.size(), 1u);
  EXPECT_STREQ(runs[0].energy[0].source, "nvml");
  EXPECT_DOUBLE_EQ(runs[0].energy[0].energy_j, 1000.0);
  EXPECT_EQ(runs[0].energy[0].samples, 400);
  ASSERT_EQ(runs[0].telemetry[0].size(), 3u);  // unwritten rows dropped
  EXPECT_DOUBLE_EQ(runs[0].telemetry[0][2].t_s, 4.0);
  std::ostringstream csv;
  report::print_energy(csv, runs, /*csv=*/true);
  EXPECT_EQ(csv.str(),
            "file,run_id,ranks,source,span_s,energy_j,j_per_sample,j_per_token,mean_power_w,max_power_w,"
            "mean_sm_clock_mhz,max_temperature_c,throttled_pct\n" +
                path + "," + run_id + ",1,nvml,4,1000,2.5,-,250,250,1250,25,50\n");  // keyed as the others, "-"
}

}  // namespace
}  // namespace mgbench::profile
