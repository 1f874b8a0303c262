// `mgbench report --paper` (report/paper_table.h): the built-in cells against the papers' text, the
// parser's checks, and the matching of runs to cells (medians, projections, predictions, not run).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "report/paper_table.h"
#include "results/reader.h"
#include "test_support.h"

namespace mgbench::report {
namespace {

using results::RunRecord;

/// The built-in cell of a table, GPU count, precision, pin_memory and metric; fails without one.
const PaperCell& cell(const std::string& table, std::int64_t gpus, const std::string& precision, const std::string& pin,
                      const std::string& metric) {
  for (const PaperCell& c : paper_values()) {
    if (c.table == table && c.gpus == gpus && c.precision == precision && c.pin_memory == pin && c.metric == metric) {
      return c;
    }
  }
  throw std::runtime_error(fmt::format("no cell {} {} GPU {} pin {} {}", table, gpus, precision, pin, metric));
}

TEST(PaperValues, BuiltInCellsAsThePaperPrintsThem) {
  const std::vector<PaperCell>& cells = paper_values();
  std::map<std::string, int> per_table;
  for (const PaperCell& c : cells) ++per_table[c.paper + " " + c.table];
  // Table 2: 12 rows of time, accuracy, efficiency vs 1 GPU, and vs FP64 where not FP64; Table 3: 8
  // rows, vs pin_memory false where true; Table 5: 8 rows of s/it and total time, the improvement
  // where true; 2505.22905: three headline figures.
  EXPECT_EQ(per_table["2503.15252 Table 2"], 12 * 3 + 8);
  EXPECT_EQ(per_table["2503.15252 Table 3"], 8 * 3 + 4);
  EXPECT_EQ(per_table["2503.15252 Table 5"], 8 * 2 + 4);
  EXPECT_EQ(per_table["2505.22905 Summary"], 3);
  EXPECT_EQ(cells.size(), 95u);

  const PaperCell& fp16 = cell("Table 2", 1, "FP16", "false", "total_time_20_epochs_s");
  EXPECT_EQ(fp16.value, 2477);
  EXPECT_EQ(fp16.line, 121);
  EXPECT_EQ(fp16.as_printed, "2 477");
  EXPECT_EQ(fp16.epochs, 20);
  EXPECT_EQ(fp16.train_samples, 60000);
  EXPECT_EQ(fp16.image_size, 0);  // not stated in the paper
  EXPECT_EQ(fp16.batch, 0);
  EXPECT_NEAR(cell("Table 2", 4, "FP32", "false", "efficiency_vs_fp64_pct").value, 154.21, 1e-9);
  EXPECT_NEAR(cell("Table 3", 4, "FP32", "true", "efficiency_vs_pin_false_pct").value, 116.62, 1e-9);
  const PaperCell& s_per_it = cell("Table 5", 2, "FP32", "false", "s_per_it");
  EXPECT_EQ(s_per_it.value, 0.93);
  EXPECT_EQ(s_per_it.line, 227);
  EXPECT_EQ(s_per_it.batch, 2);
  EXPECT_EQ(s_per_it.model, "llama3-8b");
  EXPECT_EQ(cell("Table 5", 1, "FP32", "false", "total_time_s").value, 5 * 3600 + 31 * 60 + 52);
  EXPECT_NEAR(cell("Table 5", 3, "FP32", "true", "relative_improvement_pct").value, -0.03, 1e-12);
  for (const PaperCell& c : cells) {
    // Only the unverified summary's figures are out of reach; every cell of 2503.15252 is mgbench's to match.
    EXPECT_EQ(c.not_reproducible.empty(), c.paper == "2503.15252") << c.table << " line " << c.line;
  }
}

/// Each cell at its cited line of the paper's text: the line prints it (as_printed), starts with its
/// GPU count, and lies in the table the cell names. Needs ../shared/papers.
TEST(PaperValues, EveryCellAtItsCitedLineOfThePaper) {
  const auto papers = (std::filesystem::path(test::shared_data_dir()) / ".." / "papers").lexically_normal();
  if (!std::filesystem::is_directory(papers)) {
    MGBENCH_SKIP_MISSING("no paper texts at " << papers.string()
                                              << " (the team's transcription beside its data, ../shared/papers)");
  }
  std::map<std::string, std::vector<std::string>> texts;
  for (const PaperCell& c : paper_values()) {
    auto& lines = texts[c.source];
    if (lines.empty()) {
      std::ifstream in(papers / c.source);
      ASSERT_TRUE(in.good()) << (papers / c.source).string();
      for (std::string line; std::getline(in, line);) lines.push_back(line);
    }
    ASSERT_LE(c.line, static_cast<std::int64_t>(lines.size())) << c.source;
    const std::string& line = lines[static_cast<std::size_t>(c.line - 1)];
    const std::string where = fmt::format("{} line {} ({} {}): '{}'", c.source, c.line, c.table, c.metric, line);
    EXPECT_NE(line.find(c.as_printed), std::string::npos) << where;
    if (c.table.starts_with("Table ")) {
      EXPECT_TRUE(line.starts_with(fmt::format("{}\t", c.gpus))) << where;
      std::size_t caption = static_cast<std::size_t>(c.line - 1);
      while (caption > 0 && !lines[caption].starts_with("Table ")) --caption;
      EXPECT_TRUE(lines[caption].starts_with(c.table + ".")) << where << " lies under '" << lines[caption] << "'";
    }
    if (c.table == "Table 2") {
      EXPECT_NE(line.find("\t" + c.precision + "\t"), std::string::npos) << where;
    }
    if (c.table == "Table 3" || c.table == "Table 5") {
      const std::string pin = c.pin_memory == "true" ? "TRUE" : "FALSE";
      EXPECT_NE(line.find("\t" + pin + "\t"), std::string::npos) << where;
    }
  }
}

TEST(PaperValues, NumbersAsThePaperPrintsThem) {
  EXPECT_EQ(paper_number("6 266"), 6266);
  EXPECT_EQ(paper_number("187.66%"), 187.66);
  EXPECT_EQ(paper_number("0,04%"), 0.04);
  EXPECT_EQ(paper_number("-0,03%"), -0.03);
  EXPECT_EQ(paper_number("5:31:52"), 19912);
  EXPECT_EQ(paper_number("37:58"), 2278);
  for (const char* bad : {"", "%", "abc", "1:2:3:4", "1::2", "5:", "1.5:00", "12x"}) {
    EXPECT_TRUE(std::isnan(paper_number(bad))) << bad;
  }
}

constexpr const char* kHeader =
    "paper,table,source,line,as_printed,task,gpus,strategy,precision,pin_memory,image_size,model,recipe,dataset,"
    "batch,epochs,train_samples,metric,value,unit,not_reproducible,note\n";

TEST(PaperValues, ParserNamesTheLineAndColumnOfABadCell) {
  const std::string good = "p,Table 9,src.txt,7,\"1 234\",image,2,ddp-ds,FP32,false,,,,,,20,,total_time_s,1234,s,,\n";
  ASSERT_EQ(parse_paper_values(std::string(kHeader) + good, "t.csv").size(), 1u);
  auto bad = [](const std::string& row, std::initializer_list<std::string> needles) {
    test::expect_error<DataError>([&] { parse_paper_values(std::string(kHeader) + row, "t.csv"); }, needles);
  };
  bad("p,Table 9,src.txt,7,\"1 234\",image,2,ddp-ds,FP32,false,,,,,,20,,total_time_s,1243,s,,\n",
      {"'t.csv' line 2", "column value", "'1243'", "what as_printed '1 234' reads, 1234"});
  bad("p,Table 9,src.txt,7,\"1 234\",image,2,ddp-ds,FP32,false,,,,,,20,,wall_time,1234,s,,\n",
      {"line 2", "column metric", "'wall_time'"});
  bad("p,Table 9,src.txt,7,\"1 234\",image,2,ddp-ds,BF16,false,,,,,,20,,total_time_s,1234,s,,\n",
      {"column precision", "FP64, FP32, FP16"});
  bad("p,Table 9,src.txt,7,\"1 234\",image,2,ddp-ds,FP32,false,,,,,,20,,total_time_s,1234,%,,\n",
      {"column unit", "the unit of total_time_s, s"});
  bad("p,Table 9,src.txt,7,\"1 234\",image,2,ddp-ds,FP32,false,,,,,,,,total_time_s,1234,s,,\n",
      {"column epochs", "the epochs of a time"});
  bad("p,Table 9,src.txt,x,\"1 234\",image,2,ddp-ds,FP32,false,,,,,,20,,total_time_s,1234,s,,\n",
      {"column line", "'x'", "a whole number"});
  bad("p,Table 9,src.txt,7,\"1 234\",image,2,ddp-ds,FP32,false,,,,,,20,,total_time_s,1234,s,\n",
      {"line 2", "21 fields, the header has 22"});
  bad("p,Table 9,src.txt,7,\"1 234,image,2\n", {"malformed CSV", "unterminated quote"});
  test::expect_error<DataError>([] { parse_paper_values("paper,table\np,t\n", "t.csv"); },
                                {"'t.csv' line 1", "no column 'source'"});
  // A figure mgbench cannot compute is fine where the cell says why.
  EXPECT_EQ(
      parse_paper_values(
          std::string(kHeader) + "p,Summary,s.txt,8,47%,llm,,,,,,,,,,,,less_time_pct,47,%,\"unverified, no table\",\n",
          "t.csv")
          .front()
          .not_reproducible,
      "unverified, no table");
}

constexpr const char* kH100 = "NVIDIA H100 80GB HBM3, 79.2 GiB, sm_90";

/// A completed image run as the training loop writes it: one epoch record per rank with its share
/// of `samples` (DistributedSampler's), on an H100 unless said otherwise.
RunRecord image_run(const std::string& id, std::int64_t ranks, const std::string& precision, double total_s,
                    std::int64_t epochs, std::int64_t samples = 60000) {
  RunRecord r;
  r.run_id = id;
  r.status = "completed";
  r.summary.total_s = total_s;
  r.summary.epochs_completed = epochs;
  r.summary.test_accuracy = 0.99;
  r.attributes = {{"task", std::string("image")},
                  {"recipe", std::string("classification")},
                  {"world_size", ranks},
                  {"nodes", std::int64_t{1}},
                  {"strategy", std::string("ddp-ds")},
                  {"precision", precision},
                  {"pin_memory", std::string("false")},
                  {"image_size", std::int64_t{500}},
                  {"batch_size", std::int64_t{64}},
                  {"grad_accum", std::int64_t{1}},
                  {"epochs", epochs},
                  {"train_samples", samples},
                  {"model", std::string("mobilenet_v2")},
                  {"width_mult", 1.0},
                  {"dataset", std::string("mnist")},
                  {"upscale", std::string("device")},
                  {"device", std::string("cuda")},
                  {"gpu_model", std::string(kH100)}};
  for (std::int64_t rank = 0; rank < ranks; ++rank) {
    results::EpochRecord e;
    e.epoch = 0;
    e.samples = samples / ranks;
    r.epochs.push_back({e});
  }
  return r;
}

/// `mgbench predict`'s run of `ranks` from a 1-rank run: its attributes, task prediction, no epochs.
RunRecord prediction(const RunRecord& base, std::int64_t ranks, double total_s) {
  RunRecord p = base;
  p.run_id = fmt::format("predicted-ddp-ds-{}r-of-{}", ranks, base.run_id);
  p.epochs.clear();
  p.summary.total_s = total_s;
  p.summary.test_accuracy = results::kNaN;
  for (auto& [name, value] : p.attributes) {
    if (name == "task") value = std::string("prediction");
    if (name == "world_size") value = ranks;
  }
  p.attributes.emplace_back("predicted_task", std::string("image"));
  return p;
}

/// Sets (or adds) a run attribute.
void set_attribute(RunRecord& r, const std::string& name, const h5::AttrValue& value) {
  for (auto& [n, v] : r.attributes) {
    if (n == name) {
      v = value;
      return;
    }
  }
  r.attributes.emplace_back(name, value);
}

/// The rows of a cell (by its table, GPUs, precision, pin and metric).
std::vector<const PaperRow*> rows_of(const std::vector<PaperRow>& rows, const PaperCell& c) {
  std::vector<const PaperRow*> out;
  for (const PaperRow& row : rows) {
    if (row.cell == &c) out.push_back(&row);
  }
  return out;
}

std::vector<RunRecord> table2_runs() {
  std::vector<RunRecord> runs = {
      image_run("fp16-a", 1, "fp16", 500, 20),   image_run("fp16-b", 1, "fp16", 530, 20),
      image_run("fp16-c", 1, "fp16", 520, 20),    // median 520 over 3
      image_run("fp64", 1, "fp64", 300, 5),       // projected: 300 / 5 x 20 = 1200
      image_run("tf32", 1, "tf32", 800, 20),      // the paper's FP32 as mgbench's tf32
      image_run("cpu", 1, "fp32", 10, 2, 10000),  // 2 epochs of 10,000: 10 / 2 x 20 x 6 = 600
  };
  set_attribute(runs.back(), "device", std::string("cpu"));
  set_attribute(runs.back(), "gpu_model", std::string());
  set_attribute(runs.back(), "cpu_model", std::string("Intel(R) Xeon(R) Platinum 8480+"));
  // Not the setting: 2 nodes, every rank the whole dataset (ddp), one process over all GPUs (dp), failed.
  runs.push_back(image_run("two-nodes", 2, "fp16", 100, 20));
  set_attribute(runs.back(), "nodes", std::int64_t{2});
  runs.push_back(image_run("ddp", 2, "fp16", 100, 20));
  set_attribute(runs.back(), "strategy", std::string("ddp"));
  runs.push_back(image_run("dp", 1, "fp16", 1, 20));
  set_attribute(runs.back(), "strategy", std::string("dp"));
  runs.push_back(image_run("failed", 1, "fp16", 1, 20));
  runs.back().status = "failed";
  runs.push_back(prediction(runs[4], 2, 450));  // tf32 at 2 GPUs, predicted
  return runs;
}

TEST(PaperTable, MedianOfTheMatchingRunsProjectedToThePapersRun) {
  const std::vector<RunRecord> runs = table2_runs();
  const std::vector<PaperRow> rows = paper_rows(paper_values(), runs);

  const auto fp16 = rows_of(rows, cell("Table 2", 1, "FP16", "false", "total_time_20_epochs_s"));
  ASSERT_EQ(fp16.size(), 1u);
  EXPECT_EQ(fp16[0]->mgbench, 520);
  EXPECT_EQ(fp16[0]->kind, "measured");
  EXPECT_EQ(fp16[0]->runs, (std::vector<std::string>{"fp16-a", "fp16-b", "fp16-c"}));
  EXPECT_NEAR(fp16[0]->ratio(), 520.0 / 2477.0, 1e-12);
  EXPECT_EQ(fp16[0]->card, kH100);
  EXPECT_EQ(fp16[0]->setting, "fp16, 500 px, batch 64, upscale device");  // what the paper leaves open

  const auto fp64 = rows_of(rows, cell("Table 2", 1, "FP64", "false", "total_time_20_epochs_s"));
  ASSERT_EQ(fp64.size(), 1u);
  EXPECT_EQ(fp64[0]->mgbench, 1200);
  EXPECT_EQ(fp64[0]->kind, "projected");
  EXPECT_EQ(fp64[0]->note, "projected from 5 epoch(s)");

  // The paper's FP32: the tf32 run on the H100 and the strict fp32 run on the CPU, rows of their own;
  // the CPU's 2 epochs of 10,000 images scaled to 20 of 60,000.
  const auto fp32 = rows_of(rows, cell("Table 2", 1, "FP32", "false", "total_time_20_epochs_s"));
  ASSERT_EQ(fp32.size(), 2u);
  EXPECT_EQ(fp32[0]->setting, "tf32, 500 px, batch 64, upscale device");
  EXPECT_EQ(fp32[0]->mgbench, 800);
  EXPECT_EQ(fp32[1]->card, "CPU: Intel(R) Xeon(R) Platinum 8480+");
  EXPECT_NEAR(fp32[1]->mgbench, 600, 1e-9);
  EXPECT_EQ(fp32[1]->kind, "projected");
  EXPECT_EQ(fp32[1]->note, "projected from 2 epoch(s) x 10000 samples");

  // Ratios of the row's own kind of run: FP64 over FP16 on the H100 (projected: the FP64 run was).
  const auto vs_fp64 = rows_of(rows, cell("Table 2", 1, "FP16", "false", "efficiency_vs_fp64_pct"));
  ASSERT_EQ(vs_fp64.size(), 1u);
  EXPECT_NEAR(vs_fp64[0]->mgbench, 100.0 * 1200 / 520, 1e-9);
  EXPECT_EQ(vs_fp64[0]->kind, "projected");
  // The paper's FP32 over its FP64: the tf32 row pairs with the H100's fp64 run; the CPU has none.
  const auto fp32_vs_fp64 = rows_of(rows, cell("Table 2", 1, "FP32", "false", "efficiency_vs_fp64_pct"));
  ASSERT_EQ(fp32_vs_fp64.size(), 2u);
  EXPECT_NEAR(fp32_vs_fp64[0]->mgbench, 100.0 * 1200 / 800, 1e-9);
  EXPECT_EQ(fp32_vs_fp64[1]->kind, "not run");
  EXPECT_NE(fp32_vs_fp64[1]->note.find("no run of the baseline, FP64"), std::string::npos) << fp32_vs_fp64[1]->note;
}

// A short run's total holds its warm-up: with its throughput after the warm-up recorded
// (--warmup-steps-excluded), the training is projected at that rate and the evaluations by the epochs,
// not the total scaled (which would multiply cuDNN's autotuning of the first steps 195-fold here).
TEST(PaperTable, AShortRunIsProjectedAtItsThroughputAfterTheWarmUp) {
  RunRecord run = image_run("short", 1, "fp16", 100, 3, 2048);  // 3 epochs of 2,048 images in 100 s
  run.summary.samples_per_s = 500;                              // after the warm-up
  run.summary.eval_s = 3;                                       // 1 s per epoch's evaluation
  run.attributes.emplace_back("warmup_steps_excluded", std::int64_t{4});
  run.attributes.emplace_back("test_samples", std::int64_t{512});
  const std::vector<PaperRow> rows = paper_rows(paper_values(), {run});
  const auto fp16 = rows_of(rows, cell("Table 2", 1, "FP16", "false", "total_time_20_epochs_s"));
  ASSERT_EQ(fp16.size(), 1u);
  EXPECT_NEAR(fp16[0]->mgbench, 20.0 * 60000 / 500 + 3.0 * 20 / 3, 1e-9);  // 2,400 s training + 20 s evaluation
  EXPECT_EQ(fp16[0]->kind, "projected");
  EXPECT_EQ(fp16[0]->note,
            "projected from 3 epoch(s) x 2048 samples at its throughput after the warm-up (4 step(s)), its "
            "evaluation of 512 test samples scaled by the epochs");
  // Without a warm-up excluded, its rate holds the warm-up: not said to be after it.
  std::erase_if(run.attributes, [](const auto& a) { return a.first == "warmup_steps_excluded"; });
  const std::vector<PaperRow> again = paper_rows(paper_values(), {run});
  EXPECT_EQ(rows_of(again, cell("Table 2", 1, "FP16", "false", "total_time_20_epochs_s"))[0]->note,
            "projected from 3 epoch(s) x 2048 samples at its throughput, warm-up included (--warmup-steps-excluded "
            "0), its evaluation of 512 test samples scaled by the epochs");
}

TEST(PaperTable, PredictedWhereAGpuCountWasNotMeasuredAndNotRunWhereNothingWas) {
  const std::vector<RunRecord> runs = table2_runs();
  const std::vector<PaperRow> rows = paper_rows(paper_values(), runs);
  const auto time = rows_of(rows, cell("Table 2", 2, "FP32", "false", "total_time_20_epochs_s"));
  ASSERT_EQ(time.size(), 1u);
  EXPECT_EQ(time[0]->kind, "predicted");
  EXPECT_EQ(time[0]->mgbench, 450);
  const auto scaling = rows_of(rows, cell("Table 2", 2, "FP32", "false", "efficiency_vs_1_gpu_pct"));
  ASSERT_EQ(scaling.size(), 1u);
  EXPECT_EQ(scaling[0]->kind, "predicted");
  EXPECT_NEAR(scaling[0]->mgbench, 100.0 * 800 / 450, 1e-9);
  // A prediction has no accuracy.
  const auto accuracy = rows_of(rows, cell("Table 2", 2, "FP32", "false", "test_accuracy_pct"));
  ASSERT_EQ(accuracy.size(), 1u);
  EXPECT_EQ(accuracy[0]->kind, "not run");
  // 2 GPUs FP16: only runs of another setting (2 nodes, ddp), none of this one.
  const auto fp16 = rows_of(rows, cell("Table 2", 2, "FP16", "false", "total_time_20_epochs_s"));
  ASSERT_EQ(fp16.size(), 1u);
  EXPECT_EQ(fp16[0]->kind, "not run");
  EXPECT_TRUE(std::isnan(fp16[0]->mgbench));
  EXPECT_TRUE(fp16[0]->runs.empty());
  const auto summary = rows_of(rows, paper_values().back());
  ASSERT_EQ(summary.size(), 1u);
  EXPECT_TRUE(summary[0]->kind.starts_with("not reproducible: ")) << summary[0]->kind;
}

TEST(PaperTable, LlamaLoraRunsBesideTable5) {
  RunRecord r;
  r.run_id = "lora-2";
  r.status = "completed";
  r.summary.total_s = 60;
  r.summary.s_per_it = 0.8;
  r.summary.epochs_completed = 1;
  r.attributes = {{"task", std::string("llm")},       {"recipe", std::string("lora")},
                  {"world_size", std::int64_t{2}},    {"strategy", std::string("ddp-ds")},
                  {"precision", std::string("fp32")}, {"pin_memory", std::string("false")},
                  {"batch_size", std::int64_t{2}},    {"grad_accum", std::int64_t{1}},
                  {"model", std::string("/ckpt/x")},  {"model_parameters", std::int64_t{8'030'261'248}},
                  {"dataset", std::string("alpaca")}, {"train_samples", std::int64_t{51760}},
                  {"max_steps", std::int64_t{20}},    {"gpu_model", std::string(kH100)}};
  r.epochs = {{results::EpochRecord{}}, {results::EpochRecord{}}};
  for (auto& rank : r.epochs) rank[0].samples = 40;  // 20 steps of 2
  const std::vector<PaperRow> rows = paper_rows(paper_values(), {r});
  const auto s_per_it = rows_of(rows, cell("Table 5", 2, "FP32", "false", "s_per_it"));
  ASSERT_EQ(s_per_it.size(), 1u);
  EXPECT_EQ(s_per_it[0]->mgbench, 0.8);
  EXPECT_EQ(s_per_it[0]->kind, "measured");
  EXPECT_EQ(s_per_it[0]->setting, "fp32");
  // 80 of alpaca-cleaned's 51,760 rows in 60 s: a whole epoch in 60 x 51760 / 80 s.
  const auto total = rows_of(rows, cell("Table 5", 2, "FP32", "false", "total_time_s"));
  ASSERT_EQ(total.size(), 1u);
  EXPECT_NEAR(total[0]->mgbench, 60.0 * 51760 / 80, 1e-9);
  EXPECT_EQ(total[0]->kind, "projected");
  // Another model is another setting.
  set_attribute(r, "model_parameters", std::int64_t{1'235'814'400});
  EXPECT_EQ(rows_of(paper_rows(paper_values(), {r}), cell("Table 5", 2, "FP32", "false", "s_per_it"))[0]->kind,
            "not run");
}

TEST(PaperTable, TableAndCsv) {
  const std::vector<RunRecord> runs = table2_runs();
  const std::vector<PaperRow> rows = paper_rows(paper_values(), runs);
  std::ostringstream table;
  print_paper_rows(table, rows, /*csv=*/false);
  std::istringstream lines(table.str());
  std::size_t data = 0;
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("#")) ++data;
  }
  EXPECT_EQ(data, rows.size());
  EXPECT_NE(table.str().find("H100-80GB-HBM3"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("1 GPU FP16 pin=false [fp16, 500 px, batch 64, upscale device]"), std::string::npos);

  std::ostringstream csv;
  print_paper_rows(csv, rows, /*csv=*/true);
  std::istringstream csv_lines(csv.str());
  std::string header;
  std::getline(csv_lines, header);
  EXPECT_EQ(header,
            "paper,table,source,line,setting,mgbench_setting,metric,unit,paper_value,mgbench_value,ratio,card,kind,n,"
            "runs,note");
  EXPECT_NE(csv.str().find("\n2503.15252,Table 2,lawenda2025-efficient-allocation-2503.15252.txt,121,1 GPU FP16 "
                           "pin=false,\"fp16, 500 px, batch 64, upscale device\",total_time_20_epochs_s,s,2477,520,"
                           "0.2099,\"" +
                           std::string(kH100) + "\",measured,3,fp16-a fp16-b fp16-c,\n"),
            std::string::npos)
      << csv.str();
  EXPECT_NE(csv.str().find(",not run,0,,no completed run of this setting (mgbench precision fp16)\n"),
            std::string::npos);

  // Without runs every cell mgbench can reproduce is `not run`, one row each.
  const std::vector<PaperRow> none = paper_rows(paper_values(), {});
  ASSERT_EQ(none.size(), paper_values().size());
  for (const PaperRow& row : none) {
    EXPECT_EQ(row.kind == "not run", row.cell->not_reproducible.empty()) << row.cell->line;
  }
}

}  // namespace
}  // namespace mgbench::report
