// The workload identity generated from the option tables (issue 50): the attribute list that
// `report`, `--reference`, `predict` and mgbench_analysis pair runs by is every Effect::kWorkload
// option of every job command's table, plus what a job records beside its options. The list is
// committed (python/mgbench_analysis/workload_identity.txt: the package reads it, the report compiles
// it in); this test regenerates it and fails, with the lines that differ, when a table changed and the
// file did not. To rewrite the file after classifying a new option (core/option_table.h, Effect):
//   MGBENCH_UPDATE_IDENTITY=1 build/tests/mgbench_unit_tests --gtest_filter='WorkloadIdentity.*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "comm/comm_benchmark.h"
#include "core/option_table.h"
#include "report/workload.h"
#include "results/reader.h"
#include "test_paths.h"
#include "train/job_config.h"
#include "train/recipe.h"

namespace mgbench {
namespace {

const std::string kIdentityFile =
    std::string(test::paths::source_dir()) + "/python/mgbench_analysis/workload_identity.txt";

// What a job records beside its options that is part of the workload: the command, the samples a
// recipe trains on (the data's size after --limit-train / --limit), the GPU model (the platform's).
// world_size and nodes are not: they are the axis the efficiencies scale along.
const std::vector<std::string> kJobAttributes = {"task"};
const std::vector<std::string> kRecordedAttributes = {"train_samples", "gpu_model"};

constexpr const char* kHeader =
    "# The workload identity: the run attributes (docs/results-schema.md) whose values make two runs the\n"
    "# same workload -- what is computed and on what it runs. GENERATED from the option tables by\n"
    "# tests/unit/test_workload_identity.cpp (every option whose row is Effect::kWorkload, the default:\n"
    "# core/option_table.h), which fails when this file is stale; do not edit it by hand. Rewrite it:\n"
    "#   MGBENCH_UPDATE_IDENTITY=1 build/tests/mgbench_unit_tests --gtest_filter='WorkloadIdentity.*'\n"
    "# Read by `mgbench report` (compiled in: modules/report/CMakeLists.txt) and by mgbench_analysis\n"
    "# (package data): efficiencies, `report --reference` and `predict` pair only runs equal in every\n"
    "# one; an attribute a run lacks (another command's, or a file written before it was recorded) reads\n"
    "# as empty, `recipe` as the job's only recipe of that time.\n"
    "# Out of it (their rows say .same_workload() or .no_effect()): the strategy and backend the reports\n"
    "# compare along, FSDP's reshard_after_forward, the seed and optimiser settings (they change the\n"
    "# numbers, not the work), thread and bucket counts, data and tokenizer paths, where results and\n"
    "# checkpoints go, progress and profiling switches; world_size and nodes, the axis efficiencies\n"
    "# scale along.\n";

void add_unique(std::vector<std::string>& out, const std::vector<std::string>& names) {
  for (const auto& n : names) {
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  }
}

// The identity from the tables: the job's attributes, every recipe's options in the order of the
// recipe table, `mgbench comm`'s, then what a job records.
std::vector<std::string> generated_identity() {
  std::vector<std::string> out = kJobAttributes;
  for (const auto& recipe : train::recipes()) {
    add_unique(out, train::configure(recipe.task, recipe.name)->table.workload_attributes());
  }
  comm::CommOptions comm_options;
  options::OptionTable comm_table;
  comm_options.declare(comm_table);
  add_unique(out, comm_table.workload_attributes());
  add_unique(out, kRecordedAttributes);
  return out;
}

std::string file_text(const std::vector<std::string>& names) {
  std::string text = kHeader;
  for (const auto& n : names) text += n + "\n";
  return text;
}

TEST(WorkloadIdentity, TheCommittedListIsTheTablesAndTheReportCompiledItIn) {
  const std::vector<std::string> names = generated_identity();
  const std::string expected = file_text(names);
  if (const char* update = std::getenv("MGBENCH_UPDATE_IDENTITY"); update != nullptr && std::string(update) == "1") {
    std::ofstream(kIdentityFile, std::ios::binary) << expected;
  }
  std::ifstream in(kIdentityFile, std::ios::binary);
  ASSERT_TRUE(in) << kIdentityFile;
  std::ostringstream committed;
  committed << in.rdbuf();
  EXPECT_EQ(committed.str(), expected) << kIdentityFile
                                       << " is stale: an option was added or reclassified. Rewrite it with "
                                          "MGBENCH_UPDATE_IDENTITY=1 (this file's header) and rebuild.";
  // The report binary's copy (compiled from the file at build time) is the same list.
  const auto compiled = report::workload_attributes();
  EXPECT_EQ(std::vector<std::string>(compiled.begin(), compiled.end()), names) << "rebuild: the report's copy is old";
  // The settings issue 50 found missing are there; those the reports compare along are not.
  for (const char* in_it : {"padding", "decode", "crop", "nvjpeg_backend", "limit_test", "eval_every", "drop_last",
                            "cupti", "max_seq_len", "lora_rank", "quantize_base", "collective", "max_bytes"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), in_it), names.end()) << in_it;
  }
  for (const char* out_of_it : {"strategy", "backend", "seed", "lr", "threads", "bucket_mb", "data", "results",
                                "run_name", "world_size", "warmup_steps_excluded", "reshard_after_forward"}) {
    EXPECT_EQ(std::find(names.begin(), names.end(), out_of_it), names.end()) << out_of_it;
  }
}

// Two runs that differ in one setting of the identity are two workloads; in one outside it, one.
TEST(WorkloadIdentity, RunsDifferingInPaddingOrDecodingAreNeverOneWorkload) {
  auto run = [](std::vector<std::pair<std::string, std::string>> extra) {
    results::RunRecord r;
    r.attributes = {{"task", std::string("llm")},
                    {"recipe", std::string("lora")},
                    {"padding", std::string("longest")},
                    {"decode", std::string("host")},
                    {"seed", std::int64_t{1}}};
    for (auto& [name, value] : extra) h5::merge_attributes(r.attributes, {{name, value}});
    return r;
  };
  const auto base = run({});
  EXPECT_NE(report::workload_identity(base), report::workload_identity(run({{"padding", "none"}})));
  EXPECT_NE(report::workload_identity(base), report::workload_identity(run({{"decode", "device"}})));
  const auto diff = report::workload_differences(base, run({{"padding", "none"}}));
  ASSERT_EQ(diff.size(), 1u);
  EXPECT_EQ(diff[0].attribute, "padding");
  EXPECT_EQ(report::workload_identity(base), report::workload_identity(run({{"strategy", "ddp-rr"}})));
}

}  // namespace
}  // namespace mgbench
