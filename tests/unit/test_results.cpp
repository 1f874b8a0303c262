#include <dlfcn.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "core/durable.h"
#include "core/error.h"
#include "report/predict.h"
#include "report/reference.h"
#include "report/repeats.h"
#include "report/report.h"
#include "report/stragglers.h"
#include "report/table.h"
#include "report/workload.h"
#include "results/hdf5.h"
#include "results/reader.h"
#include "results/writer.h"
#include "test_support.h"

namespace mgbench::results {
namespace {

RankLayout small_layout() {
  return {/*epochs=*/2, /*steps_per_epoch=*/3, /*indices_per_epoch=*/4, /*cuda_metrics=*/false,
          /*metrics=*/{"reward", "margin"}};
}

std::string write_run(const std::string& path, const std::string& name, double total_s) {
  ResultsWriter writer(path, MPI_COMM_SELF, name, {{"task", std::string("image")}, {"world_size", std::int64_t{1}}},
                       {{"hostname", std::string("h")}}, small_layout());
  StepRecord step;
  step.epoch = 0;
  step.step = 0;
  step.loss = 2.5;
  step.samples = 8;
  step.phases.forward_s = 0.25;
  step.step_s = 0.5;
  StepRecord next = step;
  next.step = 1;
  next.step_s = 0.3;
  writer.write_steps(0, std::vector<StepRecord>{step, next});
  EpochRecord epoch;
  epoch.epoch = 0;
  epoch.samples = 16;
  epoch.test_accuracy = 0.5;
  writer.write_epoch(epoch);
  writer.write_indices(0, std::vector<std::int64_t>{3, 1, 2, 0});
  writer.write_metrics(0, std::vector<double>{0.5, 1.5, -0.25, std::nan("")});              // 2 steps x 2 metrics
  EXPECT_THROW(writer.write_metrics(1, std::vector<double>{1.0, 2.0, 3.0}), ResultsError);  // not whole rows
  RunSummary summary;
  summary.total_s = total_s;
  summary.test_accuracy = 0.5;
  writer.write_summary(summary);
  const std::string id = writer.run_id();
  writer.finish(kStatusCompleted);
  return id;
}

// Superseded checkpoints and partial directories go through remove_tree: what remove_all would
// remove, links removed and never followed.
TEST(Durable, RemoveTreeRemovesWhatRemoveAllWouldAndNoLinkTarget) {
  namespace fs = std::filesystem;
  test::TempDir dir;
  const fs::path tree = fs::path(dir.path()) / "step-000000010";
  fs::create_directories(tree / "a" / "b");
  const fs::path outside = fs::path(dir.path()) / "kept";
  fs::create_directories(outside);
  std::ofstream(outside / "file") << "kept";
  for (const auto& f : {tree / "manifest.json", tree / "a" / "rank-0", tree / "a" / "b" / "rank-1"})
    std::ofstream(f) << "x";
  fs::create_symlink(outside, tree / "a" / "link-to-dir");
  fs::create_symlink(outside / "file", tree / "link-to-file");
  std::uintmax_t entries = 1;  // the tree's root
  for (auto it = fs::recursive_directory_iterator(tree); it != fs::recursive_directory_iterator(); ++it) ++entries;
  EXPECT_EQ(entries, 8u);
  EXPECT_EQ(remove_tree(tree.string()), entries);
  EXPECT_FALSE(fs::exists(fs::symlink_status(tree)));
  EXPECT_TRUE(fs::exists(outside / "file")) << "a link's target is not the tree's";
  EXPECT_EQ(remove_tree(tree.string()), 0u) << "a missing path removes nothing";
  EXPECT_EQ(remove_tree((outside / "file").string()), 1u);
}

// The pip wheels' libtorch.so exports its own std::filesystem (pytorch/pytorch#133437); its
// remove_all jumps to address 0 where libstdc++ lacks what it calls weakly. Our executables list
// libstdc++ before LibTorch (cmake/Dependencies.cmake), so their calls bind to libstdc++'s.
TEST(Toolchain, StdFilesystemBindsToLibstdcxxNotLibtorch) {
  namespace fs = std::filesystem;
  const std::pair<const char*, void*> functions[] = {
      {"remove_all", reinterpret_cast<void*>(static_cast<std::uintmax_t (*)(const fs::path&)>(fs::remove_all))},
      {"create_directories", reinterpret_cast<void*>(static_cast<bool (*)(const fs::path&)>(fs::create_directories))},
      {"rename", reinterpret_cast<void*>(static_cast<void (*)(const fs::path&, const fs::path&)>(fs::rename))}};
  for (const auto& [name, address] : functions) {
    Dl_info where{};
    ASSERT_NE(dladdr(address, &where), 0) << name;
    EXPECT_EQ(std::string(where.dli_fname).find("libtorch"), std::string::npos)
        << "std::filesystem::" << name << " binds to " << where.dli_fname;
  }
}

TEST(Results, WriteReadAndAppend) {
  test::TempDir dir;
  const std::string path = dir.file("r.h5");
  const std::string first = write_run(path, "first", 10.0);
  const std::string second = write_run(path, "first", 20.0);  // same name, same second: made unique
  EXPECT_NE(first, second);
  const auto runs = read_runs(path);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].run_id, first);
  EXPECT_EQ(runs[0].status, "completed");
  EXPECT_EQ(runs[0].summary.total_s, 10.0);
  EXPECT_EQ(runs[1].summary.total_s, 20.0);
  EXPECT_EQ(runs[0].text("task"), "image");
  EXPECT_EQ(runs[0].integer("world_size"), 1);
  EXPECT_FALSE(runs[0].text("hdf5_version")->empty());
  ASSERT_EQ(runs[0].epochs.size(), 1u);
  ASSERT_EQ(runs[0].epochs[0].size(), 1u);  // the unwritten second epoch is not reported
  EXPECT_EQ(runs[0].metric_names, (std::vector<std::string>{"reward", "margin"}));
  ASSERT_EQ(runs[0].metrics.size(), 1u);     // one rank
  ASSERT_EQ(runs[0].metrics[0].size(), 2u);  // the written steps; unwritten rows stay NaN and are dropped
  EXPECT_EQ(runs[0].metrics[0][1][0], -0.25);
  EXPECT_TRUE(std::isnan(runs[0].metrics[0][1][1]));
  EXPECT_EQ(runs[0].epochs[0][0].samples, 16);
  // Rank 0's first steps' times, up to the first unwritten row (what predict reads of the warm-up).
  EXPECT_EQ(runs[0].first_step_s, (std::vector<double>{0.5, 0.3}));
}

TEST(Results, RefusesForeignFilesWithoutTouchingThem) {
  test::TempDir dir;
  const std::string text = dir.file("notes.h5");
  test::write_bytes(text, {'h', 'e', 'l', 'l', 'o'});
  test::expect_error<ResultsError>([&] { write_run(text, "x", 1.0); }, {text, "not an HDF5 file"});
  std::ifstream in(text);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "hello");
  EXPECT_THROW(read_runs(text), ResultsError);
  EXPECT_THROW(read_runs(dir.file("absent.h5")), ResultsError);

  const std::string other = dir.file("other.h5");
  H5Fclose(H5Fcreate(other.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  test::expect_error<ResultsError>([&] { write_run(other, "x", 1.0); }, {other, "not an mgbench results file"});
  // Nor does a refused start leave a lock file it made beside them (was: notes.h5.lock, other.h5.lock).
  EXPECT_FALSE(std::filesystem::exists(text + ".lock"));
  EXPECT_FALSE(std::filesystem::exists(other + ".lock"));
  // The C++ readers refuse what mgbench_analysis refuses: an HDF5 file with /runs but no schema attribute.
  const std::string bare = dir.file("bare.h5");
  {
    const hid_t f = H5Fcreate(bare.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Gclose(H5Gcreate2(f, "runs", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    H5Fclose(f);
  }
  test::expect_error<ResultsError>([&] { read_runs(bare); }, {bare, "not an mgbench results file"});
}

TEST(Results, RefusesARunOfANewerSchema) {
  test::TempDir dir;
  const std::string path = dir.file("r.h5");
  const std::string id = write_run(path, "future", 1.0);
  EXPECT_EQ(read_runs(path).size(), 1u);
  {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t run = H5Gopen2(file, ("runs/" + id).c_str(), H5P_DEFAULT);
    H5Adelete(run, "schema_version");
    h5::write_attribute(run, "schema_version", std::int64_t{kSchemaVersion + 1});
    H5Gclose(run);
    H5Fclose(file);
  }
  test::expect_error<ResultsError>([&] { read_runs(path); },
                                   {path, id, fmt::format("schema version {}", kSchemaVersion + 1)});
}

TEST(Results, FailedRunKeepsItsMessage) {
  test::TempDir dir;
  const std::string path = dir.file("f.h5");
  {
    ResultsWriter writer(path, MPI_COMM_SELF, "boom", {}, {}, small_layout());
    writer.mark_failed("loss became nan");
    writer.finish(kStatusFailed);
  }
  const auto runs = read_runs(path);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].status, "failed");
  EXPECT_EQ(runs[0].error, "rank 0: loss became nan");
  EXPECT_TRUE(std::isnan(runs[0].summary.total_s));
  EXPECT_EQ(sanitize_run_name("a b/c"), "a_b_c");
}

// The writer refuses a run where its file system has less free space than run_bytes_upper_bound:
// the bound must hold for real files (else a full disk fails inside HDF5's collective calls) and
// stay near them (else a disk with room is refused).
TEST(Results, TheBytesARunNeedsBoundTheFileItMakes) {
  test::TempDir dir;
  const std::string config(20000, 'c');  // a resolved configuration's text, as big as the LLM job's
  const std::vector<RankLayout> layouts = {
      {1, 1, 0, false, {}, 0},
      small_layout(),
      {30, 2000, 60000, false, {}, 0},                  // an image run: 30 epochs, indices recorded
      {3, 5000, 0, true, {"loss", "tokens", "lr"}, 0},  // an LLM run on a GPU: CUDA tables, metrics
      {1, 1, 0, false, {}, 400},                        // `mgbench comm`
  };
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    const std::string path = dir.file(fmt::format("r{}.h5", i));
    const h5::Attributes run_attributes{{"config", config}, {"task", std::string("image")}};
    const h5::Attributes rank_attributes{{"hostname", std::string("node001")}};
    {
      ResultsWriter writer(path, MPI_COMM_SELF, "size", run_attributes, rank_attributes, layouts[i]);
      writer.finish(kStatusCompleted);
    }
    const auto bytes = static_cast<std::uint64_t>(std::filesystem::file_size(path));
    const std::uint64_t bound = run_bytes_upper_bound({&layouts[i], 1}, config.size() + 40);
    EXPECT_GE(bound, bytes) << "layout " << i;
    EXPECT_LE(bound, 2 * bytes + 256 * 1024) << "layout " << i;
  }
}

RunRecord fake_run(std::int64_t ranks, const std::string& precision, double total_s) {
  RunRecord r;
  r.run_id = precision + std::to_string(ranks);
  r.status = "completed";
  r.summary.total_s = total_s;
  r.attributes = {{"task", std::string("image")},    {"world_size", ranks},
                  {"precision", precision},          {"strategy", std::string("ddp-ds")},
                  {"image_size", std::int64_t{100}}, {"epochs", std::int64_t{2}}};
  return r;
}

TEST(Report, EfficienciesAsThePaper) {
  // Table 2 of the paper, first rows: 1 GPU FP64 6266 s, FP32 3721 s; 2 GPUs FP64 3339 s.
  const std::vector<RunRecord> runs = {fake_run(1, "fp64", 6266), fake_run(1, "fp32", 3721), fake_run(2, "fp64", 3339)};
  const auto rows = report::build_rows(runs);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_NEAR(*rows[0].efficiency_vs_1_rank, 1.0, 1e-12);
  EXPECT_FALSE(rows[0].efficiency_vs_fp64.has_value());
  EXPECT_NEAR(*rows[1].efficiency_vs_fp64, 1.6839, 1e-4);    // paper: 168.38 %
  EXPECT_NEAR(*rows[2].efficiency_vs_1_rank, 1.8766, 1e-4);  // paper: 187.66 %
  std::ostringstream table;
  report::print(table, rows, report::Format::kTable);
  EXPECT_NE(table.str().find("187.66"), std::string::npos) << table.str();
  // nccl-tests' layout: metadata, header and units rows start with '#'; only data rows do not.
  std::istringstream lines(table.str());
  std::vector<std::string> data;
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("#")) data.push_back(line);
  }
  ASSERT_EQ(data.size(), 3u) << table.str();
  EXPECT_TRUE(data[0].starts_with("  fp641 ")) << data[0];
  EXPECT_NE(table.str().find("\n# run "), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("(px)"), std::string::npos) << table.str();
  std::ostringstream csv;
  report::print(csv, rows, report::Format::kCsv);
  EXPECT_NE(csv.str().find(",168.40"), std::string::npos) << csv.str();
}

// Efficiencies pair runs of one workload identity only: the same GPU model, device kind, model width
// (workload_identity.txt); a run without a 1-rank run of its identity says why.
TEST(Report, EfficienciesPairOnlyRunsOfOneWorkloadIdentity) {
  auto on = [](int ranks, double total_s, const std::string& id, const std::string& device, const std::string& gpu,
               double width) {
    RunRecord r = fake_run(ranks, "fp32", total_s);
    r.run_id = id;
    r.attributes.emplace_back("device", device);
    r.attributes.emplace_back("gpu_model", gpu);
    r.attributes.emplace_back("width_mult", width);
    return r;
  };
  const std::string h100 = "NVIDIA H100 80GB HBM3, 79.2 GiB, sm_90";  // as the runtime writes gpu_model
  const std::vector<RunRecord> runs = {
      on(1, 100, "a100-1", "cuda", "NVIDIA A100-SXM4-80GB", 1.0),
      on(1, 80, "h100-1-narrow", "cuda", h100, 0.25),
      on(2, 60, "h100-2", "cuda", h100, 1.0),
      on(2, 45, "h100-2-narrow", "cuda", h100, 0.25),
      on(1, 40, "cpu-1", "cpu", "", 1.0),
      on(2, 30, "cpu-2", "cpu", "", 1.0),
  };
  const auto rows = report::build_rows(runs);
  ASSERT_EQ(rows.size(), runs.size());
  // h100-2 (width 1.0) pairs with neither the A100 run nor the H100 width-0.25 one, and says so.
  EXPECT_FALSE(rows[2].efficiency_vs_1_rank.has_value());
  EXPECT_EQ(rows[2].baseline_note,
            "h100-2: no 1-rank run of this workload on NVIDIA H100 80GB HBM3, 79.2 GiB, sm_90; the nearest, "
            "h100-1-narrow, differs in "
            "width_mult '1' vs '0.25'");
  ASSERT_TRUE(rows[3].efficiency_vs_1_rank.has_value());
  EXPECT_NEAR(*rows[3].efficiency_vs_1_rank, 80.0 / 45.0, 1e-12);
  // The device kind is part of it too: the CPU runs pair with each other only.
  ASSERT_TRUE(rows[5].efficiency_vs_1_rank.has_value());
  EXPECT_NEAR(*rows[5].efficiency_vs_1_rank, 40.0 / 30.0, 1e-12);
  EXPECT_TRUE(rows[5].baseline_note.empty());
  std::ostringstream table;
  report::print(table, rows, report::Format::kTable);
  EXPECT_NE(table.str().find("\n# h100-2: no 1-rank run of this workload"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find(" H100-80GB-HBM3 "), std::string::npos) << table.str();
  std::ostringstream csv;
  report::print(csv, rows, report::Format::kCsv);
  // The model's commas quoted (RFC 4180), so that every CSV line has the header's field count.
  EXPECT_NE(csv.str().find(",cuda,\"NVIDIA H100 80GB HBM3, 79.2 GiB, sm_90\","), std::string::npos) << csv.str();
  EXPECT_EQ(report::csv_field("a \"b\", c"), "\"a \"\"b\"\", c\"");
  EXPECT_EQ(report::csv_field("plain"), "plain");
}

// Repeated baselines: the median of the 1-rank (and fp64) runs' times, not the latest run's; an LLM run's
// tokens/s over the median of the 1-rank runs that left out the same warm-up, and a note naming the
// warm-up where only another's ran (was: no efficiency and no note).
TEST(Report, RepeatedBaselinesTakeTheirMedianAndAnLlmRunNamesAnotherWarmup) {
  const std::vector<RunRecord> image = {fake_run(1, "fp32", 90), fake_run(1, "fp32", 100), fake_run(1, "fp32", 200),
                                        fake_run(2, "fp64", 60), fake_run(2, "fp64", 80),  fake_run(2, "fp32", 50)};
  const auto rows = report::build_rows(image);
  ASSERT_TRUE(rows[5].efficiency_vs_1_rank.has_value() && rows[5].efficiency_vs_fp64.has_value());
  EXPECT_NEAR(*rows[5].efficiency_vs_1_rank, 100.0 / 50.0, 1e-12);  // the median of 90, 100, 200 (latest: 200)
  EXPECT_NEAR(*rows[5].efficiency_vs_fp64, 70.0 / 50.0, 1e-12);     // the mean of the middle two of 60, 80
  auto llm = [](std::int64_t ranks, double tokens_per_s, std::int64_t warmup) {
    RunRecord r = fake_run(ranks, "bf16", 10);
    r.run_id = fmt::format("llm-{}-{}", ranks, tokens_per_s);
    r.summary.tokens_per_s = tokens_per_s;
    r.attributes = {{"task", std::string("llm")},       {"world_size", ranks},
                    {"precision", std::string("bf16")}, {"strategy", std::string("ddp")},
                    {"model", std::string("tiny")},     {"warmup_steps_excluded", warmup}};
    return r;
  };
  const auto efficiency = [](const std::vector<RunRecord>& runs) {
    std::ostringstream csv;
    report::print_llm(csv, runs, report::Format::kCsv);
    std::istringstream lines(csv.str());
    std::string header, row;
    std::getline(lines, header);
    std::string last;
    while (std::getline(lines, row)) last = row;  // the 2-rank run, the last
    const auto column = [](const std::string& line, std::size_t k) {
      std::istringstream fields(line);
      std::string f;
      for (std::size_t i = 0; i <= k; ++i) std::getline(fields, f, ',');
      return f;
    };
    std::size_t k = 0;
    while (column(header, k) != "efficiency_vs_1_rank_pct") ++k;
    return column(last, k);
  };
  EXPECT_EQ(efficiency({llm(1, 100, 2), llm(1, 300, 2), llm(1, 110, 2), llm(2, 180, 2)}), "81.82");  // 180/2/110
  const std::vector<RunRecord> other_warmup = {llm(1, 100, 0), llm(2, 180, 2)};
  EXPECT_EQ(efficiency(other_warmup), "-");
  EXPECT_EQ(report::baseline_note(other_warmup[1], other_warmup),
            "llm-2-180: no 1-rank run of this workload on -; the nearest, llm-1-100, differs in "
            "warmup_steps_excluded '2' vs '0'");
  EXPECT_EQ(report::baseline_note(other_warmup[1], {llm(1, 100, 2), llm(2, 180, 2)}), "");
}

// Repeats as one run: the one of median time (predict's base, the prediction table's measured run),
// of an even number the faster of the middle two; was the latest run in both.
TEST(Report, PredictionsAreComparedWithTheRepeatOfMedianTime) {
  EXPECT_EQ(report::median_run({}), nullptr);
  const std::vector<RunRecord> one_rank = {fake_run(1, "fp32", 90), fake_run(1, "fp32", 300), fake_run(1, "fp32", 100),
                                           fake_run(1, "fp32", 200)};
  std::vector<const RunRecord*> runs = {&one_rank[0], &one_rank[1], &one_rank[2]};
  EXPECT_EQ(report::median_run(runs), &one_rank[2]);  // 90, 100, 300: 100 (the latest: 300)
  runs.push_back(&one_rank[3]);
  EXPECT_EQ(report::median_run(runs), &one_rank[2]);  // 90, 100, 200, 300: the faster of the middle two
  // The prediction table: a 2-rank prediction of 60 s beside 2-rank repeats of 40, 50 and 80 s (latest).
  std::vector<RunRecord> all = {fake_run(2, "fp32", 40), fake_run(2, "fp32", 50), fake_run(2, "fp32", 80)};
  for (std::size_t k = 0; k < all.size(); ++k) all[k].run_id = fmt::format("measured-{}", k);
  RunRecord prediction = fake_run(2, "fp32", 60);
  prediction.run_id = "predicted";
  h5::merge_attributes(prediction.attributes,
                       {{"task", std::string("prediction")}, {"predicted_task", std::string("image")}});
  all.push_back(prediction);
  std::ostringstream csv;
  report::print_prediction_check(csv, all, /*csv=*/true);
  EXPECT_NE(csv.str().find(",measured-1,50.000,20.00\n"), std::string::npos) << csv.str();
}

// `report --reference`: medians over each side's repeats, the direction of each metric, the tolerance,
// failed runs, and runs of no reference workload left out with a note.
TEST(Report, ReferenceComparesMediansMetricByMetricWithinTheTolerance) {
  auto image = [](const std::string& id, double img_per_s, double total_s, const std::string& precision = "fp32") {
    RunRecord r = fake_run(2, precision, total_s);
    r.run_id = id;
    r.summary.samples_per_s = img_per_s;
    r.summary.peak_memory_bytes = 1024 * 1024 * 100;
    return r;
  };
  // Reference: three repeats (median img/s 1000, total 20 s, i.e. 10 s/epoch at 2 epochs).
  const std::vector<RunRecord> reference = {image("ref-a", 900, 22), image("ref-b", 1000, 20),
                                            image("ref-c", 1100, 19)};
  // Two repeats, medians 930 img/s (-7 %) and 21.5 s: holds at 10 %, regressed at 5 %.
  std::vector<RunRecord> runs = {image("new-a", 920, 21), image("new-b", 940, 22), image("other", 500, 50, "fp16")};
  auto check = report::compare_to_reference(reference, runs, 0.10);
  ASSERT_EQ(check.rows.size(), 3u);
  EXPECT_EQ(check.rows[0].metric, "img/s");
  EXPECT_NEAR(check.rows[0].measured, 930.0, 1e-12);
  EXPECT_NEAR(check.rows[0].reference, 1000.0, 1e-12);
  EXPECT_EQ(check.rows[0].reference_runs, 3u);
  EXPECT_EQ(check.rows[0].measured_runs, 2u);
  EXPECT_EQ(check.rows[0].verdict, report::Verdict::kHolds);
  EXPECT_EQ(check.rows[1].metric, "s/epoch");
  EXPECT_NEAR(check.rows[1].ratio, 10.75 / 10.0, 1e-12);
  EXPECT_FALSE(check.rows[1].higher_is_better);
  EXPECT_EQ(check.rows[2].metric, "peak_MiB");
  EXPECT_FALSE(check.any_regressed());
  ASSERT_EQ(check.notes.size(), 1u);  // the fp16 run: no reference of its workload
  EXPECT_NE(check.notes[0].find("other: no reference run of this workload on -; the nearest, ref-c, differs in "
                                "precision 'fp16' vs 'fp32'"),
            std::string::npos)
      << check.notes[0];
  check = report::compare_to_reference(reference, runs, 0.05);
  EXPECT_EQ(check.rows[0].verdict, report::Verdict::kRegressed);  // 930 < 0.95 x 1000
  EXPECT_EQ(check.rows[1].verdict, report::Verdict::kRegressed);  // 10.75 > 1.05 x 10
  EXPECT_EQ(check.rows[2].verdict, report::Verdict::kHolds);
  EXPECT_TRUE(check.any_regressed());
  // Faster and smaller: improved, never a regression.
  check = report::compare_to_reference(reference, {image("fast", 1500, 12)}, 0.10);
  EXPECT_EQ(check.rows[0].verdict, report::Verdict::kImproved);
  EXPECT_EQ(check.rows[1].verdict, report::Verdict::kImproved);
  EXPECT_FALSE(check.any_regressed());
  EXPECT_EQ(check.exit_status(), 0);
  // One rule for rates and times: a slowdown above 1 + tolerance. At 25 %: 790 img/s is 1000/790 =
  // 1.27x slower and 25.5 s (12.75 s/epoch) 1.275x, both regressed; 810 img/s (1.23x) and 24.6 s
  // (1.23x) both hold. (The old rule let img/s fall to 0.75x, i.e. 1.33x slower, while s/epoch
  // regressed at 1.25x.)
  check = report::compare_to_reference(reference, {image("slow", 790, 25.5)}, 0.25);
  EXPECT_EQ(check.rows[0].verdict, report::Verdict::kRegressed);
  EXPECT_EQ(check.rows[1].verdict, report::Verdict::kRegressed);
  EXPECT_EQ(check.exit_status(), 1);
  check = report::compare_to_reference(reference, {image("slightly", 810, 24.6)}, 0.25);
  EXPECT_EQ(check.rows[0].verdict, report::Verdict::kHolds);
  EXPECT_EQ(check.rows[1].verdict, report::Verdict::kHolds);
  // A run that did not complete, of either side, is a FAILED row and exit 2: nothing of it can be
  // judged, and a note says why.
  RunRecord failed = image("crashed", std::nan(""), std::nan(""));
  failed.status = "failed";
  failed.error = "rank 1: NCCL timeout";
  RunRecord aborted = image("cut", std::nan(""), std::nan(""));
  aborted.status = "aborted";
  aborted.error = "rank 1 lost";
  check = report::compare_to_reference(reference, {failed, aborted, image("new-a", 920, 21)}, 0.10);
  ASSERT_EQ(check.rows.size(), 5u);  // two status rows, then the completed run's three metrics
  EXPECT_EQ(check.rows[0].verdict, report::Verdict::kFailed);
  EXPECT_EQ(check.rows[1].run, "cut");
  EXPECT_EQ(check.rows[1].verdict, report::Verdict::kFailed);
  EXPECT_TRUE(check.any_failed());
  EXPECT_FALSE(check.any_regressed());
  EXPECT_EQ(check.exit_status(), 2);
  std::ostringstream table;
  report::print_reference(table, check, "ref.h5", 0.10, false);
  EXPECT_NE(table.str().find("# crashed failed: rank 1: NCCL timeout"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("# cut aborted: rank 1 lost"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("FAIL\n"), std::string::npos) << table.str();
  std::vector<RunRecord> with_aborted_reference = reference;
  with_aborted_reference.push_back(aborted);
  check = report::compare_to_reference(with_aborted_reference, {image("new-a", 920, 21)}, 0.10);
  EXPECT_EQ(check.rows[0].run, "cut");
  EXPECT_EQ(check.rows[0].verdict, report::Verdict::kFailed);
  EXPECT_EQ(check.exit_status(), 2);
  ASSERT_FALSE(check.notes.empty());
  EXPECT_EQ(check.notes[0], "reference run cut aborted: rank 1 lost");
}

// Repeats: one group per workload, ranks, ...; median, min, max and the sample coefficient of variation.
TEST(Report, RepeatsSummariseEachMetricOverTheRunsOfAWorkload) {
  auto image = [](const std::string& id, int ranks, double img_per_s) {
    RunRecord r = fake_run(ranks, "fp32", 20);
    r.run_id = id;
    r.summary.samples_per_s = img_per_s;
    return r;
  };
  const auto rows =
      report::repeat_rows({image("a", 2, 900), image("alone", 1, 400), image("b", 2, 1100), image("c", 2, 1000)});
  ASSERT_EQ(rows.size(), 2u);  // img/s and s/epoch of the 2-rank group; the 1-rank run ran once
  EXPECT_EQ(rows[0].run, "c");
  EXPECT_EQ(rows[0].metric, "img/s");
  EXPECT_EQ(rows[0].runs, 3u);
  EXPECT_DOUBLE_EQ(rows[0].median, 1000.0);
  EXPECT_DOUBLE_EQ(rows[0].min, 900.0);
  EXPECT_DOUBLE_EQ(rows[0].max, 1100.0);
  EXPECT_NEAR(rows[0].cv, 0.1, 1e-12);  // sample standard deviation 100 over the mean 1000
  EXPECT_EQ(rows[1].metric, "s/epoch");
  EXPECT_NEAR(rows[1].cv, 0.0, 1e-12);
  // `mgbench predict`'s runs (written where the training writes, outputs/results.h5) are no repeats of
  // a measurement, nor a reference or a run to judge (were: a repeats group; "holds" and exit 0).
  auto predicted = [&](const std::string& id, double img_per_s) {
    RunRecord r = image(id, 2, img_per_s);
    for (auto& [name, value] : r.attributes) {
      if (name == "task") value = std::string("prediction");
    }
    return r;
  };
  EXPECT_TRUE(report::repeat_rows({predicted("p", 900), predicted("q", 1100)}).empty());
  const auto check = report::compare_to_reference({predicted("p", 900)}, {predicted("q", 10)}, 0.10);
  EXPECT_TRUE(check.rows.empty());
  ASSERT_EQ(check.notes.size(), 1u);
  EXPECT_EQ(check.notes[0], "2 predicted run(s) (mgbench predict) left out: predictions are not measurements");
}

TEST(Report, NotesAndCsvColumnForPreemptedAndResumedRuns) {
  RunRecord preempted = fake_run(2, "fp32", std::nan(""));
  preempted.status = "preempted";
  RunRecord resumed = fake_run(2, "fp64", 100);
  resumed.attributes.emplace_back("resumes", std::int64_t{2});
  const RunRecord plain = fake_run(1, "fp64", 180);
  const std::vector<RunRecord> runs = {preempted, resumed, plain};  // rows point into it
  const auto rows = report::build_rows(runs);
  std::ostringstream table;
  report::print(table, rows, report::Format::kTable);
  EXPECT_NE(table.str().find("# fp322 preempted: it continues with the same options plus --resume"), std::string::npos)
      << table.str();
  EXPECT_NE(table.str().find("# fp642 resumed 2 time(s) from a checkpoint"), std::string::npos) << table.str();
  EXPECT_EQ(table.str().find("# fp641 "), std::string::npos) << table.str();
  EXPECT_NEAR(*rows[1].efficiency_vs_1_rank, 1.8, 1e-12);  // a resumed, completed run still counts
  std::ostringstream csv;
  report::print(csv, rows, report::Format::kCsv);
  std::istringstream lines(csv.str());
  std::string header, first, second, third;
  std::getline(lines, header);
  std::getline(lines, first);
  std::getline(lines, second);
  std::getline(lines, third);
  EXPECT_TRUE(header.ends_with(",resumes")) << header;
  EXPECT_TRUE(first.ends_with(",0") && second.ends_with(",2") && third.ends_with(",0")) << csv.str();
}

TEST(Report, PhasesMinAvgMaxAcrossRanks) {
  RunRecord run = fake_run(2, "fp32", 10);
  for (double forward : {1.0, 3.0}) {
    EpochRecord e;
    e.epoch = 0;
    e.train_s = 4.0;
    e.phases.forward_s = forward;
    run.epochs.push_back({e, e});  // two epochs per rank
  }
  std::ostringstream out;
  report::print_phases(out, {run});
  // forward: rank 0 2 s, rank 1 6 s -> min 2, avg 4, max 6; share (2/8 + 6/8) / 2 = 50 %.
  EXPECT_NE(out.str().find("forward               2.000      4.000      6.000     50.0"), std::string::npos)
      << out.str();
  EXPECT_NE(out.str().find("train                 8.000      8.000      8.000    100.0"), std::string::npos)
      << out.str();
}

TEST(Report, StragglersAreTheRanksSlowOutsideTheCollectives) {
  // Three synchronous ranks end each epoch together (train_s 10 s); rank 2 computes 2 s longer in
  // backward, and the others wait for it in the all-reduce and the buffers' broadcast.
  RunRecord run = fake_run(3, "fp32", 10);
  for (int r = 0; r < 3; ++r) {
    EpochRecord e;
    e.epoch = 0;
    e.train_s = 10.0;
    e.phases.forward_s = 3.0;
    e.phases.backward_s = r == 2 ? 6.0 : 4.0;
    e.phases.allreduce_s = r == 2 ? 0.5 : 2.0;
    e.phases.buffer_broadcast_s = r == 2 ? 0.1 : 0.6;
    run.epochs.push_back({e});
    run.rank_attributes.push_back({{"hostname", std::string("node" + std::to_string(r))}});
  }
  const auto s = report::find_stragglers(run);
  ASSERT_EQ(s.size(), 1U);
  EXPECT_EQ(s[0].rank, 2);
  EXPECT_EQ(s[0].host, "node2");
  EXPECT_NEAR(s[0].own_s, 9.4, 1e-12);            // 10 - 0.5 - 0.1
  EXPECT_NEAR(s[0].others_median_s, 7.4, 1e-12);  // 10 - 2.0 - 0.6
  EXPECT_EQ(s[0].phase, "backward");
  EXPECT_NEAR(s[0].phase_excess_s, 2.0, 1e-12);
  std::ostringstream out;
  report::print_phases(out, {run});
  EXPECT_NE(out.str().find("# straggler: rank 2 (node2): 9.400 s outside the collectives, +27 % over the other "
                           "ranks' median 7.400 s (margin 20 %); most in backward (+2.000 s)"),
            std::string::npos)
      << out.str();
  // Within the margin (rank 2 waits 1.1 s too: 8.8 s, 19 % over 7.4 s): none named.
  run.epochs[2][0].phases.allreduce_s = 1.1;
  EXPECT_TRUE(report::find_stragglers(run).empty());
  // One rank: nothing to compare.
  run.epochs.resize(1);
  EXPECT_TRUE(report::find_stragglers(run).empty());
}

}  // namespace
}  // namespace mgbench::results
