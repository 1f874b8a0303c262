#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/option_table.h"
#include "runtime/grad_sync.h"
#include "runtime/mpi_communicator.h"
#include "runtime/mpi_env.h"
#include "runtime/peak_flops.h"
#include "test_paths.h"
#include "test_support.h"
#include "train/job_config.h"
#include "train/optim/lr_schedule.h"
#include "train/recipe.h"

namespace mgbench {
namespace {

/// The configuration of task with one option set to text; validating it must fail naming needle.
void expect_refused(const std::string& task, const std::string& option, const std::string& text,
                    const std::string& needle) {
  auto config = train::configure(task);
  if (task == "llm" && option != "data") config->set("data", "x.json");
  test::expect_error<ConfigError>(
      [&] {
        config->set(option, text);
        config->validate();
      },
      {needle});
}

TEST(JobConfig, EveryBadValueIsRefusedNamingTheOption) {
  auto ok = train::configure("image");
  EXPECT_NO_THROW(ok->validate());
  EXPECT_EQ(ok->recipe_name, "classification");
  for (const auto& [option, text] : std::vector<std::pair<std::string, std::string>>{{"strategy", "fsdp"},
                                                                                     {"device", "tpu"},
                                                                                     {"backend", "gloo"},
                                                                                     {"upscale", "gpu"},
                                                                                     {"profile-window", "720"},
                                                                                     {"profile-window", "steps:x:3"},
                                                                                     {"precision", "fp8"},
                                                                                     {"optimizer", "lion"},
                                                                                     {"lr-schedule", "linear"},
                                                                                     {"model", "resnet-9000"},
                                                                                     {"pin-memory", "maybe"},
                                                                                     {"epochs", "abc"},
                                                                                     {"epochs", "2.5"},
                                                                                     {"lr", "fast"},
                                                                                     {"lr", "inf"},
                                                                                     {"seed", "-1"}}) {
    expect_refused("image", option, text, "--" + option + " '" + text + "': expected");
  }
  // Bounds: the message names the option, the value and the bound.
  expect_refused("image", "batch-size", "0", "--batch-size '0': expected >= 1");
  expect_refused("image", "image-size", "5000", "--image-size '5000': expected <= 4096");
  expect_refused("image", "image-size", "-3", "--image-size '-3': expected >= 1");
  expect_refused("image", "dropout", "1", "--dropout '1': expected < 1");
  expect_refused("image", "lr", "0", "--lr '0': expected > 0");
  expect_refused("image", "prefetch", "65", "--prefetch '65': expected <= 64");
  // More threads than the machine has cores; a bucket smaller than a byte (issue 16).
  expect_refused("image", "threads", "100000", "--threads '100000': expected <= ");
  expect_refused("image", "bucket-mb", "1e-300", "--bucket-mb '1e-300': expected >= ");
  expect_refused("image", "first-bucket-mb", "0", "--first-bucket-mb '0': expected >= ");
  {
    test::TempDir dir;
    { std::ofstream(dir.file("a-file")) << "x"; }
    expect_refused("image", "checkpoint-dir", dir.file("a-file"), "a file, expected a directory");
  }
  // Rules between options.
  expect_refused("image", "checkpoint-every", "5", "--checkpoint-dir");
  expect_refused("image", "resume", "true", "--checkpoint-dir");
  // The llm task: its recipe's options and rules.
  expect_refused("llm", "lora-rank", "0", "--lora-rank '0': expected >= 1");
  expect_refused("llm", "dataset", "dolly", "--dataset 'dolly': expected alpaca, grammar, samsum, slimorca or text");
  expect_refused("llm", "precision", "fp16", "--precision 'fp16': expected bf16, fp32 or fp64");
  expect_refused("llm", "strategy", "dp", "--strategy 'dp'");
  expect_refused("llm", "lora-targets", "q_proj,attention", "attention");
  expect_refused("llm", "adapter", "dir", "--adapter 'dir': only with --eval-only");
  auto no_data = train::configure("llm");
  test::expect_error<ConfigError>([&] { no_data->validate(); }, {"--data: required"});
  test::expect_error<ConfigError>([] { train::configure("llm", "dpo-nope"); }, {"--recipe 'dpo-nope'", "lora"});
}

TEST(JobConfig, RecipeDefaultsAndTheResolvedConfigurationReadBack) {
  auto image = train::configure("image");
  auto llm = train::configure("llm");
  // Each recipe's defaults of the loop's options: the paper's image job, TorchTune's llama3 8B LoRA.
  EXPECT_EQ(image->train.epochs, 20);
  EXPECT_EQ(image->train.optim.optimizer, train::OptimizerKind::kSgd);
  EXPECT_EQ(llm->train.batch_size, 2);
  EXPECT_EQ(llm->train.optim.warmup_steps, 100);
  EXPECT_EQ(llm->train.precision, axes::Precision::kBf16);
  // Values are parsed once into typed fields.
  image->set("strategy", "ddp-rr");
  image->set("precision", "amp-bf16");
  image->set("lr", "0.1");
  image->set("record-indices", "true");
  EXPECT_EQ(image->train.strategy, axes::Strategy::kDdpRr);
  EXPECT_EQ(image->train.precision, axes::Precision::kAmpBf16);
  EXPECT_DOUBLE_EQ(image->train.optim.lr, 0.1);
  EXPECT_TRUE(image->train.record_indices);
  // The resolved configuration, read back into a fresh configuration, is the same configuration.
  auto again = train::configure("image");
  std::istringstream lines(image->ini());
  for (std::string line; std::getline(lines, line);) {
    const auto eq = line.find(" = ");
    again->set(line.substr(0, eq), line.substr(eq + 3));
  }
  EXPECT_EQ(again->ini(), image->ini());
  EXPECT_NE(again->ini(), train::configure("image")->ini());
  EXPECT_NE(image->ini().find("strategy = ddp-rr\n"), std::string::npos);
  EXPECT_NE(image->ini().find("lr = 0.1\n"), std::string::npos);  // shortest exact text, not 0.10000000000000001
}

// Every file of inputs/configs/recipes/ is a recipe's defaults as the binary has them built in, byte for
// byte, its first line the command that runs the recipe (tests/python/test_cli.py runs each so);
// every recipe has its file.
TEST(JobConfig, EveryRecipeConfigFileIsBuiltIn) {
  const std::filesystem::path folder =
      std::filesystem::path(test::paths::source_dir()) / "inputs" / "configs" / "recipes";
  std::set<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    const std::string name = entry.path().stem().string();
    ASSERT_EQ(entry.path().extension(), ".ini") << entry.path();
    files.insert(name);
    const auto& rows = train::recipes();
    const auto row = std::find_if(rows.begin(), rows.end(), [&](const auto& r) { return r.name == name; });
    ASSERT_NE(row, rows.end()) << entry.path() << " is no recipe's defaults";
    std::ifstream in(entry.path(), std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    EXPECT_EQ(row->defaults, text.str()) << entry.path() << ": rebuild (cmake/EmbedText.cmake embeds it)";
    EXPECT_TRUE(text.str().starts_with(fmt::format("# mgbench {} --recipe {}:", row->task, name))) << entry.path();
  }
  for (const auto& r : train::recipes()) {
    EXPECT_EQ(files.count(std::string(r.name)), 1u) << "no inputs/configs/recipes/" << r.name << ".ini";
  }
}

// A model's own training defaults (ResNet-50: torchvision's reference lr and weight decay) apply to
// what is not given; a given value, or the default model, keeps the recipe's.
TEST(JobConfig, ModelDefaultsFillOnlyWhatIsNotGiven) {
  auto mobilenet = train::configure("image");
  mobilenet->validate();
  EXPECT_DOUBLE_EQ(mobilenet->train.optim.lr, 0.05);
  EXPECT_DOUBLE_EQ(mobilenet->train.optim.weight_decay, 4e-5);
  auto resnet = train::configure("image");
  resnet->set("model", "resnet50");
  resnet->validate();
  EXPECT_DOUBLE_EQ(resnet->train.optim.lr, 0.1);
  EXPECT_DOUBLE_EQ(resnet->train.optim.weight_decay, 1e-4);
  EXPECT_NE(resnet->ini().find("lr = 0.1\n"), std::string::npos);  // in the identity and the results
  auto given = train::configure("image");
  given->set("model", "resnet50");
  given->set("lr", "0.02");
  given->validate();
  EXPECT_DOUBLE_EQ(given->train.optim.lr, 0.02);
  EXPECT_DOUBLE_EQ(given->train.optim.weight_decay, 1e-4);
}

TEST(JobConfig, QuantisedRecipesTakeTorchTunesDefaultsAndRefuseWhatDoesNotCombine) {
  // Each recipe's row (TorchTune's llama3/8B_qlora_single_device, 8B_full, 8B_qat_full, 8B_qat_lora).
  const auto ini_of = [](const std::string& recipe) { return train::configure("llm", recipe)->ini(); };
  for (const auto& [recipe, lines] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"lora", {"quantize-base = none\n", "finetune = lora\n", "fake-quant = none\n", "lr = 0.0003\n"}},
           {"qlora",
            {"quantize-base = nf4\n", "finetune = lora\n", "grad-accum = 8\n", "activation-checkpointing = true\n"}},
           {"full",
            {"quantize-base = none\n", "finetune = full\n", "fake-quant = none\n", "lr = 2e-05\n",
             "lr-schedule = constant\n"}},
           {"qat", {"finetune = full\n", "fake-quant = 8da4w\n", "qat-group-size = 256\n", "lr = 2e-05\n"}},
           {"qat-lora", {"finetune = lora\n", "fake-quant = 8da4w\n", "qat-group-size = 256\n", "grad-accum = 8\n"}}}) {
    const std::string ini = ini_of(recipe);
    for (const auto& line : lines) EXPECT_NE(ini.find(line), std::string::npos) << recipe << ": " << line << ini;
  }
  // The rules between the quantisation options, each message naming the options involved.
  const auto refused = [](const std::string& recipe, const std::vector<std::pair<std::string, std::string>>& settings,
                          const std::string& needle) {
    auto config = train::configure("llm", recipe);
    config->set("data", "x.json");
    test::expect_error<ConfigError>(
        [&] {
          for (const auto& [option, text] : settings) config->set(option, text);
          config->validate();
        },
        {needle});
  };
  refused("qlora", {{"finetune", "full"}}, "--quantize-base nf4: expected --finetune lora");
  refused("qlora", {{"fake-quant", "8da4w"}}, "--quantize-base nf4 with --fake-quant 8da4w");
  refused("qlora", {{"precision", "fp64"}}, "--quantize-base nf4 with --precision fp64");
  refused("lora", {{"fake-quant-after-steps", "10"}}, "--fake-quant-after-steps '10': only with --fake-quant 8da4w");
  refused("qat", {{"qat-group-size", "1"}}, "--qat-group-size '1': expected >= 2");
  refused("qat", {{"fake-quant", "int4"}}, "--fake-quant 'int4': expected none or 8da4w");
  refused("dpo", {{"finetune", "full"}}, "--finetune full: the dpo recipe needs --finetune lora");
  refused("lora", {{"quantize-base", "nf8"}}, "--quantize-base 'nf8': expected none or nf4");
}

// An option given where the run has no use for it is refused, naming what it needs (was: silently
// ignored -- `--crop center` on MNIST, `--lora-targets q_proj,attention` with --recipe full); given at
// its default, or read back from a run's resolved configuration, it passes.
TEST(JobConfig, AnOptionThatDoesNotApplyIsRefusedNamingWhatItNeeds) {
  const auto outcome = [](const std::string& task, const std::string& recipe,
                          const std::vector<std::pair<std::string, std::string>>& settings) -> std::string {
    auto config = train::configure(task, recipe);
    if (task == "llm") config->set("data", "x.json");
    try {
      for (const auto& [option, text] : settings) config->set(option, text);
      config->validate();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  const std::string files = "only with --dataset imagefolder or webdataset";
  for (const auto& [option, text] : std::vector<std::pair<std::string, std::string>>{
           {"crop", "center"}, {"loader-threads", "8"}, {"skip-bad-images", "true"}, {"decode", "device"}}) {
    EXPECT_EQ(outcome("image", "", {{option, text}}), fmt::format("--{} '{}': {}", option, text, files));
    EXPECT_EQ(outcome("image", "", {{"dataset", "imagefolder"}, {option, text}}), "") << option;
  }
  EXPECT_EQ(outcome("image", "", {{"nvjpeg-backend", "hardware"}}),
            "--nvjpeg-backend 'hardware': only with --decode device");
  EXPECT_EQ(outcome("image", "", {{"reshard-after-forward", "false"}}),
            "--reshard-after-forward 'false': only with --sharding fsdp");
  EXPECT_EQ(outcome("image", "", {{"sharding", "fsdp"}, {"reshard-after-forward", "false"}}), "");
  // SGD's momentum, DDP's buckets, the telemetry's interval, CUPTI's window: each where its part runs.
  EXPECT_EQ(outcome("image", "", {{"optimizer", "adamw"}, {"momentum", "0.5"}}),
            "--momentum '0.5': only with --optimizer sgd");
  EXPECT_EQ(outcome("image", "", {{"momentum", "0.5"}}), "");
  for (const auto& [option, text] : std::vector<std::pair<std::string, std::string>>{
           {"bucket-mb", "5"}, {"first-bucket-mb", "0.5"}, {"gradient-as-bucket-view", "true"}}) {
    EXPECT_EQ(
        outcome("image", "", {{"sharding", "fsdp"}, {option, text}}),
        fmt::format("--{} '{}': only with --sharding none (FSDP reduce-scatters per unit: no buckets)", option, text));
    EXPECT_EQ(outcome("image", "", {{option, text}}), "") << option;
  }
  EXPECT_EQ(outcome("image", "", {{"telemetry", "off"}, {"telemetry-interval", "50"}}),
            "--telemetry-interval '50': only with --telemetry auto, nvml or rapl");
  EXPECT_EQ(outcome("image", "", {{"cupti", "false"}, {"profile-window", "0:10"}}),
            "--profile-window '0:10': only with --cupti true");
  EXPECT_EQ(outcome("image", "", {{"profile-window", "0:10"}}), "");
  for (const auto& [option, text] : std::vector<std::pair<std::string, std::string>>{
           {"lora-rank", "4"}, {"lora-alpha", "8"}, {"lora-dropout", "0.1"}, {"lora-targets", "q_proj,attention"}}) {
    EXPECT_EQ(outcome("llm", "full", {{option, text}}),
              fmt::format("--{} '{}': only with --finetune lora", option, text));
    EXPECT_EQ(outcome("llm", "qat", {{option, text}}),
              fmt::format("--{} '{}': only with --finetune lora", option, text));
  }
  EXPECT_EQ(outcome("llm", "lora", {{"qat-group-size", "32"}}), "--qat-group-size '32': only with --fake-quant 8da4w");
  EXPECT_EQ(outcome("llm", "qat-lora", {{"qat-group-size", "32"}, {"lora-rank", "4"}}), "");
  EXPECT_EQ(outcome("llm", "lora", {{"output-dir", "out"}, {"eval-only", "true"}}),
            "--output-dir 'out': only with a training run (--eval-only writes nothing)");
  // At its default (the recipe's: qat's group size is 256), or every option from a run's resolved
  // configuration (--config of its ini(): each given, those that do not apply at their defaults).
  EXPECT_EQ(outcome("llm", "full", {{"lora-rank", "8"}, {"qat-group-size", "256"}}), "");
  for (const auto& [task, recipe] : std::vector<std::pair<std::string, std::string>>{{"image", ""}, {"llm", "full"}}) {
    auto run = train::configure(task, recipe);
    if (task == "llm") run->set("data", "x.json");
    run->validate();
    std::vector<std::pair<std::string, std::string>> resolved;
    std::istringstream lines(run->ini());
    for (std::string line; std::getline(lines, line);) {
      const auto eq = line.find(" = ");
      resolved.emplace_back(line.substr(0, eq), line.substr(eq + 3));
    }
    EXPECT_EQ(outcome(task, recipe, resolved), "") << task << " " << recipe;
  }
}

TEST(JobConfig, IdentityHoldsTheSettingsThatChangeResultsOnly) {
  auto a = train::configure("image");
  auto b = train::configure("image");
  // Where results go, progress, checkpoint cadence, the watchdog and profiling do not change results.
  for (const auto& [option, text] : std::vector<std::pair<std::string, std::string>>{{"results", "elsewhere.h5"},
                                                                                     {"run-name", "x"},
                                                                                     {"repeat", "3"},
                                                                                     {"progress-interval", "3"},
                                                                                     {"checkpoint-dir", "ck"},
                                                                                     {"checkpoint-every", "7"},
                                                                                     {"resume", "true"},
                                                                                     {"comm-timeout", "30"},
                                                                                     {"profile-window", "0:720"},
                                                                                     {"nvtx", "false"}}) {
    b->set(option, text);
  }
  EXPECT_EQ(a->identity(), b->identity());
  EXPECT_NE(a->ini(), b->ini());
  // Everything else does -- including the settings the old identity left out.
  for (const auto& [option, text] : std::vector<std::pair<std::string, std::string>>{{"warmup-steps", "500"},
                                                                                     {"momentum", "0.5"},
                                                                                     {"weight-decay", "0"},
                                                                                     {"dropout", "0"},
                                                                                     {"freeze-batchnorm", "true"},
                                                                                     {"bucket-mb", "4"},
                                                                                     {"first-bucket-mb", "2"},
                                                                                     {"pin-memory", "true"},
                                                                                     {"clip-grad-norm", "1"},
                                                                                     {"record-indices", "true"},
                                                                                     {"cupti", "false"},
                                                                                     {"threads", "2"}}) {
    auto c = train::configure("image");
    c->set(option, text);
    EXPECT_NE(c->identity(), a->identity()) << option;
    const auto diff = options::differences(a->identity(), c->identity());
    ASSERT_EQ(diff.size(), 1u) << option;
    EXPECT_EQ(diff[0].rfind("--" + option + ": ", 0), 0u) << diff[0];
  }
  auto llm = train::configure("llm");
  auto other = train::configure("llm");
  other->set("lora-dropout", "0.1");
  other->set("max-steps", "10");
  other->set("output-dir", "adapters");  // where adapters go: no effect
  EXPECT_EQ(options::differences(llm->identity(), other->identity()),
            (std::vector<std::string>{"--lora-dropout: 0 -> 0.1", "--max-steps: 0 -> 10"}));
}

TEST(OptionTable, DeclaresParsesAndChecks) {
  options::OptionTable t;
  std::int64_t n = 3;
  double x = 0.5;
  bool flag = false;
  std::vector<std::string> list{"a", "b"};
  std::string name = "z";
  t.section("S");
  t.add("n", n, "a count").at_least(1);
  t.add("x", x, "a fraction").at_least(0).below(1);
  t.add("flag", flag, "a switch").as_switch().no_effect();
  t.add("list", list, "a list");
  t.add("name", name, "a name").required();
  EXPECT_THROW(t.add("n", n, "again"), std::logic_error);
  test::expect_error<ConfigError>([&] { t.validate(); }, {"--name: required"});
  t.set("name", "y");
  t.set("list", " c, d ,,e");
  EXPECT_EQ(list, (std::vector<std::string>{"c", "d", "e"}));
  t.set("x", "1e-3");
  EXPECT_DOUBLE_EQ(x, 1e-3);
  EXPECT_NO_THROW(t.validate());
  t.set("n", "0");
  test::expect_error<ConfigError>([&] { t.validate(); }, {"--n '0': expected >= 1"});
  test::expect_error<ConfigError>([&] { t.set("n", "12abc"); }, {"--n '12abc': expected an integer"});
  test::expect_error<ConfigError>([&] { t.set("x", "nan"); }, {"--x 'nan': expected a finite number"});
  EXPECT_THROW(t.set("undeclared", "1"), std::out_of_range);
  t.set("n", "4");
  t.set("flag", "true");
  EXPECT_EQ(t.ini(), "n = 4\nx = 0.001\nflag = true\nlist = c,d,e\nname = y\n");
  EXPECT_EQ(t.identity(), "n = 4\nx = 0.001\nlist = c,d,e\nname = y\n");  // flag: no effect on results
  const auto attributes = t.attributes();
  ASSERT_EQ(attributes.size(), 5u);
  EXPECT_EQ(std::get<std::int64_t>(attributes[0].second), 4);
  EXPECT_EQ(std::get<std::string>(attributes[2].second), "true");
  EXPECT_TRUE(t.find("flag")->given);
  std::int64_t m = 1;
  t.add("m", m, "another count");
  t.set_defaults("m = 9\nx = 0.25\n");  // a recipe's defaults: values, not given
  EXPECT_EQ(m, 9);
  EXPECT_DOUBLE_EQ(x, 1e-3);  // given: kept
  EXPECT_FALSE(t.find("m")->given);
  test::expect_error<ConfigError>([&] { t.set_defaults("m = many\n"); }, {"--m 'many'"});
  EXPECT_THROW(t.set_defaults("m=3\n"), std::logic_error);  // a recipe's defaults are --config lines
  t.set_defaults("# a header, as recipe files have = not a setting\nm = 4\n");  // comments as in --config files
  EXPECT_EQ(m, 4);
  // An option of some runs only: refused given with another value than its default where it does
  // not apply; the default a recipe sets is its default from then on.
  bool applies = false;
  std::int64_t group = 32;
  t.add("group", group, "a group size").only_with([&applies] { return applies; }, "--quantized");
  t.set_defaults("group = 256\n");
  t.set("group", "256");
  EXPECT_NO_THROW(t.validate());
  t.set("group", "32");
  test::expect_error<ConfigError>([&] { t.validate(); }, {"--group '32': only with --quantized"});
  t.reset_unused();  // a recorded configuration read back (predict): what had no effect, its default
  EXPECT_EQ(group, 256);
  EXPECT_NO_THROW(t.validate());
  t.set("group", "32");
  applies = true;
  t.reset_unused();
  EXPECT_EQ(group, 32);
  EXPECT_NO_THROW(t.validate());
  EXPECT_THROW(t.only_with(
                   "group", [] { return true; }, "twice"),
               std::logic_error);
  EXPECT_FALSE(t.find("name")->is_switch);
  EXPECT_EQ(options::differences("a = 1\nb = 2\n", "b = 3\nc = 4\n"),
            (std::vector<std::string>{"--a: 1 -> (none)", "--b: 2 -> 3", "--c: (none) -> 4"}));
  // A named value (--image-size native): the word stands for a value outside the bounds, until resolved.
  std::int64_t size = 100;
  t.add("size", size, "a size").at_least(1).named_value("native", 0);
  EXPECT_EQ(t.find("size")->value_name, "N|native");
  t.set("size", "native");
  EXPECT_EQ(size, 0);
  EXPECT_NO_THROW(t.validate());
  EXPECT_NE(t.identity().find("size = native\n"), std::string::npos);
  EXPECT_EQ(std::get<std::string>(t.attributes().back().second), "native");
  size = 300;  // resolved: the value from then on
  EXPECT_EQ(std::get<std::int64_t>(t.attributes().back().second), 300);
  t.set("size", "0");  // the number itself is bounded as any other
  test::expect_error<ConfigError>([&] { t.validate(); }, {"--size '0': expected >= 1"});
  t.set("size", "native");
  t.set("size", "7");
  EXPECT_EQ(t.find("size")->text(), "7");
  // A unit the value may carry (--tolerance 10%): dropped before parsing; alone, it is no number.
  double pct = 1;
  t.add("pct", pct, "a percentage").above(0).accepts_suffix("%");
  t.set("pct", "10%");
  EXPECT_DOUBLE_EQ(pct, 10);
  t.set("pct", "12.5");
  EXPECT_DOUBLE_EQ(pct, 12.5);
  test::expect_error<ConfigError>([&] { t.set("pct", "%"); }, {"--pct '%': expected a finite number"});
  // The three effects: kWorkload (the default) in both identities, kResult in the checkpoint's only.
  options::OptionTable w;
  std::int64_t work = 1, numbers = 2, none = 3;
  w.add("work", work, "the workload");
  w.add("numbers", numbers, "a seed").same_workload();
  w.add("none", none, "a path").no_effect();
  EXPECT_EQ(w.identity(), "work = 1\nnumbers = 2\n");
  EXPECT_EQ(w.workload_attributes(), (std::vector<std::string>{"work"}));
}

TEST(LrSchedule, WarmupThenCosine) {
  // torchtune's LambdaLR: the first optimizer step runs with lambda(0) = 0.
  EXPECT_DOUBLE_EQ(train::lr_at_step(1.0, 0, 4, 100, true), 0.0);
  EXPECT_DOUBLE_EQ(train::lr_at_step(1.0, 1, 4, 100, true), 0.25);
  EXPECT_DOUBLE_EQ(train::lr_at_step(1.0, 3, 4, 100, true), 0.75);
  EXPECT_DOUBLE_EQ(train::lr_at_step(1.0, 4, 4, 100, true), 1.0);
  EXPECT_NEAR(train::lr_at_step(1.0, 52, 4, 100, true), 0.5, 1e-12);
  EXPECT_NEAR(train::lr_at_step(1.0, 100, 4, 100, true), 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(train::lr_at_step(0.1, 50, 0, 100, false), 0.1);
}

TEST(GradSync, HooksLaunchBucketsDuringBackward) {
  runtime::MpiCommunicator comm(MPI_COMM_SELF);
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(64, 256), torch::nn::ReLU(), torch::nn::Linear(256, 256),
                            torch::nn::ReLU(), torch::nn::Linear(256, 10));
  runtime::GradSyncOptions options;
  options.first_bucket_bytes = 4096;
  options.bucket_bytes = 64 * 1024;
  runtime::GradSync sync(net->parameters(), comm, options);
  ASSERT_GE(sync.num_buckets(), 3u);
  const torch::Tensor x = torch::randn({8, 64});
  sync.prepare();
  net->forward(x).pow(2).mean().backward();
  std::vector<torch::Tensor> expected;
  for (const auto& p : net->parameters()) expected.push_back(p.grad().clone());
  // Every bucket completes inside backward, all launched before finish().
  EXPECT_EQ(sync.buckets_launched_in_backward(), sync.num_buckets());
  sync.finish();
  const auto params = net->parameters();
  for (std::size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i].grad(), expected[i]));
}

// The buckets' options from the command line: sizes in bytes (a byte at least), the view choice, and
// the all-reduce after backward with CUDA graphs; without hooks no bucket launches inside backward.
TEST(GradSync, OptionsFromTheCommandLineAndGraphsLaunchAfterBackward) {
  auto c = train::configure("image");
  c->set("bucket-mb", "4");
  c->set("first-bucket-mb", "1e-9");
  c->set("gradient-as-bucket-view", "true");
  const runtime::GradSyncOptions eager = c->train.grad_sync_options(/*cuda_graphs=*/false);
  EXPECT_EQ(eager.bucket_bytes, 4u << 20);
  EXPECT_EQ(eager.first_bucket_bytes, 1u);
  EXPECT_TRUE(eager.gradient_as_bucket_view);
  EXPECT_TRUE(eager.launch_in_backward);
  runtime::GradSyncOptions graphs = c->train.grad_sync_options(/*cuda_graphs=*/true);
  EXPECT_FALSE(graphs.launch_in_backward);
  runtime::MpiCommunicator comm(MPI_COMM_SELF);
  torch::nn::Linear net(16, 8);
  graphs.gradient_as_bucket_view = false;
  runtime::GradSync sync(net->parameters(), comm, graphs);
  sync.prepare();
  net->forward(torch::randn({4, 16})).sum().backward();
  EXPECT_EQ(sync.buckets_launched_in_backward(), 0u);
  const torch::Tensor expected = net->weight.grad().clone();
  sync.finish();
  EXPECT_TRUE(torch::equal(net->weight.grad(), expected));  // one rank: the mean is the gradient
}

TEST(PeakFlops, EachGpuModelHasItsOwnDatasheetPeak) {
  using runtime::MathKind;
  const auto tflops = [](std::string_view name, int sms, MathKind kind) {
    return runtime::peak_flops(name, sms, kind, 0).flops / 1e12;
  };
  // cudaDeviceProp names and SM counts of the real boards.
  EXPECT_EQ(tflops("NVIDIA H100 80GB HBM3", 132, MathKind::kBf16), 989.5);
  EXPECT_EQ(tflops("NVIDIA H100 PCIe", 114, MathKind::kBf16), 756.0);
  EXPECT_EQ(tflops("NVIDIA H100 NVL", 132, MathKind::kBf16), 835.5);
  EXPECT_EQ(tflops("NVIDIA H200", 132, MathKind::kFp16), 989.5);
  EXPECT_EQ(tflops("NVIDIA H200 NVL", 132, MathKind::kBf16), 835.5);
  EXPECT_EQ(tflops("NVIDIA GH200 480GB", 132, MathKind::kBf16), 989.5);
  EXPECT_EQ(tflops("NVIDIA A100-SXM4-80GB", 108, MathKind::kBf16), 312.0);
  EXPECT_EQ(tflops("NVIDIA H100 80GB HBM3", 132, MathKind::kTf32), 494.5);
  EXPECT_EQ(tflops("NVIDIA H100 80GB HBM3", 132, MathKind::kFp32), 67.0);
  EXPECT_EQ(tflops("NVIDIA H100 80GB HBM3", 132, MathKind::kFp64), 67.0);
  // A name the table has with another SM count (a cut-down part), an unknown GPU, the CPU: NaN, said why.
  const runtime::PeakFlops partial = runtime::peak_flops("NVIDIA H100 80GB HBM3", 66, MathKind::kBf16, 0);
  EXPECT_TRUE(std::isnan(partial.flops));
  EXPECT_NE(partial.source.find("66 SMs"), std::string::npos) << partial.source;
  EXPECT_TRUE(std::isnan(tflops("NVIDIA RTX 6000 Ada Generation", 142, MathKind::kBf16)));
  EXPECT_NE(runtime::peak_flops("", 0, MathKind::kFp32, 0).source.find("--peak-tflops"), std::string::npos);
  // --peak-tflops wins, and says so.
  const runtime::PeakFlops configured = runtime::peak_flops("NVIDIA H100 PCIe", 114, MathKind::kBf16, 500);
  EXPECT_EQ(configured.flops, 500e12);
  EXPECT_EQ(configured.source, "--peak-tflops");
  EXPECT_NE(runtime::peak_flops("NVIDIA H100 PCIe", 114, MathKind::kBf16, 0).source.find("datasheet"),
            std::string::npos);
}

TEST(MpiEnvironment, RefusesAnMpiWithoutThreadMultiple) {
  EXPECT_NO_THROW(runtime::require_thread_multiple(MPI_THREAD_MULTIPLE, "Open MPI v4.1.4"));
  test::expect_error<CommError>([] { runtime::require_thread_multiple(MPI_THREAD_SERIALIZED, "Some MPI v1.0"); },
                                {"MPI_THREAD_SERIALIZED", "MPI_THREAD_MULTIPLE", "Some MPI v1.0"});
  test::expect_error<CommError>([] { runtime::require_thread_multiple(MPI_THREAD_FUNNELED, "x"); },
                                {"MPI_THREAD_FUNNELED"});
  int provided = 0;
  MPI_Query_thread(&provided);
  EXPECT_EQ(provided, MPI_THREAD_MULTIPLE);  // the library the tests run on gives it
}

TEST(MpiCommunicator, RejectsWhatMpiCannotReduce) {
  runtime::MpiCommunicator comm(MPI_COMM_SELF);
  torch::Tensor flags = torch::zeros({4}, torch::kBool);
  EXPECT_THROW(comm.all_reduce(flags, runtime::ReduceOp::kSum), CommError);
  torch::Tensor strided = torch::zeros({4, 4}).t();
  EXPECT_THROW(comm.all_reduce(strided, runtime::ReduceOp::kSum), CommError);
}

TEST(MpiCommunicator, StagesHalfTypesThroughFloat32) {
  runtime::MpiCommunicator comm(MPI_COMM_SELF);
  for (auto dtype : {torch::kFloat16, torch::kBFloat16}) {
    torch::Tensor t = torch::tensor({1.5, -2.0, 3.25}).to(dtype);
    const torch::Tensor before = t.clone();
    auto work = comm.all_reduce(t, runtime::ReduceOp::kSum);
    work->wait();
    EXPECT_EQ(t.scalar_type(), dtype);
    EXPECT_TRUE(torch::equal(t, before));                 // one rank: the sum is the tensor itself
    EXPECT_GT(work->seconds_since_start_of(*work), 0.0);  // launch to the completion wait() saw
  }
}

TEST(GradSync, ChannelsLastGradientsKeepTheirLayoutThroughTheBucket) {
  runtime::MpiCommunicator comm(MPI_COMM_SELF);
  torch::manual_seed(2);
  torch::nn::Sequential net(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3)), torch::nn::ReLU(),
                            torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 4, 3)));
  for (auto& p : net->parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
  }
  runtime::GradSync sync(net->parameters(), comm);
  const torch::Tensor x = torch::randn({2, 3, 9, 9}).contiguous(torch::MemoryFormat::ChannelsLast);
  for (int step = 0; step < 2; ++step) {
    for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
    sync.prepare();
    net->forward(x).pow(2).sum().backward();
    std::vector<torch::Tensor> expected;
    for (const auto& p : net->parameters()) expected.push_back(p.grad().clone());
    sync.finish();
    const auto params = net->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::equal(params[i].grad(), expected[i])) << i;  // one rank: the mean is the gradient
      EXPECT_EQ(params[i].grad().strides(), params[i].strides()) << i;
    }
  }
}

TEST(GradSync, ReportsTheAllReduceWindow) {
  runtime::MpiCommunicator comm(MPI_COMM_SELF);
  torch::nn::Linear net(16, 4);
  runtime::GradSync sync(net->parameters(), comm);
  EXPECT_EQ(sync.window_s(), 0.0);  // nothing launched yet
  sync.prepare();
  net->forward(torch::randn({2, 16})).sum().backward();
  sync.finish();
  const double window = sync.window_s();
  EXPECT_GT(window, 0.0);
  EXPECT_LT(window, 5.0);
}

}  // namespace
}  // namespace mgbench

namespace mgbench::train {
namespace {

TEST(MemoryPlan, TheFewestRanksThatFitDoubleFromTheFirstAsked) {
  // A plan whose state divides by the ranks: 100 GiB over `world` ranks, plus 1 GiB gathered.
  constexpr std::int64_t kGiB = std::int64_t{1} << 30;
  const auto plan = [](int world) { return MemoryPlanRow{world, world > 1, 100 * kGiB / world + kGiB, 0, 0, -1}; };
  EXPECT_EQ(fewest_ranks_that_fit(plan, 1, 80.0 * kGiB), 2);            // 51 GiB at 2 ranks
  EXPECT_EQ(fewest_ranks_that_fit(plan, 1, 30.0 * kGiB), 4);            // 26 GiB at 4
  EXPECT_EQ(fewest_ranks_that_fit(plan, 8, 200.0 * kGiB), 8);           // never below `from`
  EXPECT_EQ(fewest_ranks_that_fit(plan, 2, 1.0 * kGiB), std::nullopt);  // the gathered unit alone
  EXPECT_EQ(fewest_ranks_that_fit([](int w) { return MemoryPlanRow{w, false, 1, 0, 0, 5}; }, 1, 5.0), std::nullopt)
      << "activations count in the total";
}

TEST(MemoryPlan, ThePrintedPlanSaysWhichGpuMemoryFitsFromWhichRankCount) {
  constexpr std::int64_t kGiB = std::int64_t{1} << 30;
  const std::vector<std::string> lines = format_memory_plan({{1, false, 100 * kGiB, 50 * kGiB, 0, -1},
                                                             {2, true, 60 * kGiB, 25 * kGiB, 0, 10 * kGiB},
                                                             {4, true, 30 * kGiB, 12 * kGiB, 0, 10 * kGiB}});
  ASSERT_EQ(lines.size(), 2U + 3U + 2U);
  EXPECT_NE(lines[2].find("150.00 GiB"), std::string::npos) << lines[2];  // 1 rank: no activations ('-')
  EXPECT_NE(lines[2].find(" - "), std::string::npos) << lines[2];
  EXPECT_NE(lines[3].find("95.00 GiB"), std::string::npos) << lines[3];  // 60 + 25 + 10
  EXPECT_EQ(lines[5], "80 GiB GPUs: fits from 4 rank(s) of those planned");
  EXPECT_EQ(lines[6], "141 GiB GPUs: fits from 2 rank(s) of those planned");
  EXPECT_NE(format_memory_plan({{1, false, 200 * kGiB, 0, 0, -1}})[3].find("no planned rank count fits"),
            std::string::npos);
}

// What a failing rank logs and writes into the results file's `error`: LibTorch's message without
// the backtrace c10::Error appends (a failed allocation in `mgbench comm` stored 52 frames).
TEST(ErrorMessage, LibTorchErrorsLoseTheirBacktraceOthersStayWhole) {
  try {
    (void)torch::zeros({2, 3}).view({4});
    FAIL() << "expected c10::Error";
  } catch (const c10::Error& e) {
    const std::string whole = e.what();
    ASSERT_NE(whole.find("\nException raised from "), std::string::npos) << whole;  // not vacuous
    EXPECT_EQ(error_message(e), e.what_without_backtrace());
    EXPECT_EQ(error_message(e).find("frame #"), std::string::npos);
  }
  // C10_ENFORCE's form (an allocation beyond memory, as `comm --max-bytes 100G` made): frames
  // follow the message without "Exception raised from".
  try {
    (void)torch::empty({std::int64_t{1} << 60}, torch::kUInt8);
    FAIL() << "expected c10::Error for 1 EiB (past any address space, overcommit or not)";
  } catch (const c10::Error& e) {
    const std::string whole = e.what();
    ASSERT_NE(whole.find("\nframe #0: "), std::string::npos) << whole;  // not vacuous
    EXPECT_EQ(error_message(e), e.what_without_backtrace());
    EXPECT_NE(error_message(e).find("can't allocate memory"), std::string::npos) << error_message(e);
  }
  const DataError plain("dataset 'x.json': row 3: expected an object\nsecond line");
  EXPECT_EQ(error_message(plain), plain.what());
}

}  // namespace
}  // namespace mgbench::train
