// Checkpoints and the agreed stop, across ranks: atomic commit, the newest-two retention, refusals
// (another world size, a corrupt manifest), state round trips (model, optimizer, RNG, records), and
// StopAgreement stopping every rank at the same step boundary.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/agreement.h"
#include "core/error.h"
#include "mpi_support.h"
#include "results/schema.h"
#include "runtime/mpi_env.h"
#include "runtime/stop_request.h"
#include "train/checkpoint/checkpoint_state.h"
#include "train/checkpoint/checkpointer.h"

namespace mgbench::test {
namespace {

namespace fs = std::filesystem;

runtime::MpiEnvironment& environment() {
  static int argc = 0;
  static char** argv = nullptr;
  static runtime::MpiEnvironment env(&argc, &argv);  // MPI is already initialised by the test main
  return env;
}

train::CheckpointState state_with(std::int64_t step) {
  train::CheckpointState state;
  state.put("weights", torch::full({3, 2}, static_cast<double>(step) + world_rank(), torch::kFloat64));
  state.put("step", step);
  state.put("loss", 0.25 * static_cast<double>(step));
  state.put("nan", std::numeric_limits<double>::quiet_NaN());
  return state;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Checkpointer, CommitsAtomicallyKeepsTheNewestTwoAndIgnoresPartialOnes) {
  SharedDir dir;
  auto& env = environment();
  train::Checkpointer checkpointer({dir.file("ck"), 3, true}, env, "image", "model=a\nlr=0.1\n");
  ASSERT_FALSE(checkpointer.latest().has_value());  // nothing yet: not an error
  EXPECT_TRUE(checkpointer.due(3));
  EXPECT_FALSE(checkpointer.due(4));
  EXPECT_FALSE(checkpointer.due(0));
  for (std::int64_t step : {3, 6, 9}) {
    train::CheckpointManifest m = checkpointer.manifest(step, 1, false);
    m.results = "r.h5";
    m.run_id = "run";
    ASSERT_TRUE(checkpointer.save(m, state_with(step)));
  }
  // A save that died half-way (no manifest, not renamed) must be invisible.
  if (world_rank() == 0) fs::create_directories(fs::path(checkpointer.directory()) / "step-000000012.partial");
  MPI_Barrier(MPI_COMM_WORLD);
  const auto latest = checkpointer.latest();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->global_step, 9);
  EXPECT_EQ(latest->world_size, world_size());
  EXPECT_EQ(latest->results, "r.h5");
  EXPECT_FALSE(latest->completed);
  const train::CheckpointState loaded = checkpointer.load(*latest);
  EXPECT_EQ(loaded.integer("step"), 9);
  EXPECT_DOUBLE_EQ(loaded.number("loss"), 2.25);
  EXPECT_TRUE(std::isnan(loaded.number("nan")));
  EXPECT_TRUE(loaded.tensor("weights").equal(torch::full({3, 2}, 9.0 + world_rank(), torch::kFloat64)));  // this rank's
  EXPECT_THROW(loaded.integer("absent"), DataError);
  EXPECT_THROW(loaded.tensor("absent"), DataError);

  // Retention: the two newest; the next save also sweeps the abandoned .partial directory.
  ASSERT_TRUE(checkpointer.save(checkpointer.manifest(12, 2, true), state_with(12)));
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(entries(checkpointer.directory()), (std::vector<std::string>{"step-000000009", "step-000000012"}));
  EXPECT_TRUE(checkpointer.latest()->completed);

  // Another configuration has a directory of its own.
  train::Checkpointer other({dir.file("ck"), 0, true}, env, "image", "model=a\nlr=0.2\n");
  EXPECT_NE(other.directory(), checkpointer.directory());
  EXPECT_FALSE(other.latest().has_value());
}

TEST(Checkpointer, RefusesAnotherWorldSizeAndACorruptManifestOnEveryRank) {
  SharedDir dir;
  auto& env = environment();
  train::Checkpointer checkpointer({dir.file("ck"), 1, true}, env, "llm", "x=1\n");
  ASSERT_TRUE(checkpointer.save(checkpointer.manifest(1, 0, false), state_with(1)));
  const std::string manifest = checkpointer.directory() + "/step-000000001/checkpoint.json";
  if (world_rank() == 0) {
    std::ifstream in(manifest);
    nlohmann::json j = nlohmann::json::parse(in);
    j["world_size"] = world_size() + 1;
    std::ofstream(manifest) << j.dump();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  try {
    checkpointer.latest();
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("same number of ranks"), std::string::npos) << e.what();
  }
  // A global step other than the directory's (was: taken as written, and named in the messages).
  for (const std::int64_t step : {std::int64_t{7}, std::int64_t{-1}}) {
    if (world_rank() == 0) {
      std::ifstream in(manifest);
      nlohmann::json j = nlohmann::json::parse(in);
      j["world_size"] = world_size();
      j["global_step"] = step;
      std::ofstream(manifest) << j.dump();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    try {
      checkpointer.latest();
      ADD_FAILURE() << "expected DataError for global step " << step;
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(step < 0 ? "global_step -1" : "says global step 7"), std::string::npos)
          << e.what();
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  if (world_rank() == 0) std::ofstream(manifest) << "{ not json";
  MPI_Barrier(MPI_COMM_WORLD);
  try {
    checkpointer.latest();
    ADD_FAILURE() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(manifest), std::string::npos) << e.what();
  }
}

TEST(Checkpointer, OptionsNeedADirectory) {
  EXPECT_THROW((train::CheckpointOptions{"", 5, false}.validate()), ConfigError);
  EXPECT_THROW((train::CheckpointOptions{"", 0, true}.validate()), ConfigError);
  EXPECT_NO_THROW((train::CheckpointOptions{"", 0, false}.validate()));
  EXPECT_NO_THROW((train::CheckpointOptions{"d", 5, true}.validate()));
}

/// Expects f to throw ConfigError on every rank, its message holding every needle.
template <typename F>
void expect_refused_everywhere(F f, std::initializer_list<std::string> needles) {
  int refused = 0;
  try {
    f();
  } catch (const ConfigError& e) {
    refused = 1;
    for (const auto& needle : needles) EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  int everywhere = refused;
  MPI_Allreduce(MPI_IN_PLACE, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(everywhere, 1);
}

TEST(Checkpointer, AResumeContinuesOnlyItsOwnConfigurationAndSaysWhatDiffers) {
  SharedDir dir;
  auto& env = environment();
  const std::string identity = "lr = 0.1\nwarmup-steps = 0\nseed = 42\n";
  train::Checkpointer first({dir.file("ck"), 2, false}, env, "image", identity);
  EXPECT_FALSE(first.find_start().has_value());  // a new run in an empty directory
  train::CheckpointManifest m = first.manifest(4, 0, false);
  m.results = "r.h5";
  m.run_id = "run-a";
  ASSERT_TRUE(first.save(m, state_with(4)));

  // The same configuration resumes its checkpoint...
  train::Checkpointer same({dir.file("ck"), 2, true}, env, "image", identity);
  const auto found = same.find_start();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->global_step, 4);
  EXPECT_EQ(found->run_id, "run-a");
  // ...but a new run of it (no --resume) would mix its checkpoints with the earlier run's: refused.
  expect_refused_everywhere(
      [&] {
        train::Checkpointer({dir.file("ck"), 2, false}, env, "image", identity).find_start();
      },
      {"already holds checkpoints of this configuration", "run-a", "--resume"});
  // --resume with a setting that changes results: refused, naming the settings and how to start afresh.
  train::Checkpointer changed({dir.file("ck"), 2, true}, env, "image", "lr = 0.1\nwarmup-steps = 500\nseed = 7\n");
  expect_refused_everywhere([&] { changed.find_start(); },
                            {"no checkpoint of this configuration", "run-a", "--warmup-steps: 0 -> 500",
                             "--seed: 42 -> 7", "leave out --resume"});
  try {
    changed.find_start();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find("--lr:"), std::string::npos) << e.what();
  }
  // A new run of the changed configuration is fine: its checkpoints have a directory of their own.
  train::Checkpointer changed_new({dir.file("ck"), 2, false}, env, "image", "lr = 0.1\nwarmup-steps = 500\n");
  EXPECT_FALSE(changed_new.find_start().has_value());
  EXPECT_NE(changed_new.directory(), first.directory());
  // Another task's checkpoints are not this job's: --resume starts a new run.
  train::Checkpointer llm({dir.file("ck"), 2, true}, env, "llm", "x = 1\n");
  EXPECT_FALSE(llm.find_start().has_value());
}

TEST(CheckpointState, ModelOptimizerAndRngRoundTripContinueIdentically) {
  SharedDir dir;
  auto make = [] {
    torch::manual_seed(7);
    return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::Dropout(0.3),
                                 torch::nn::Linear(8, 2));
  };
  auto train_step = [](torch::nn::Sequential& model, torch::optim::Optimizer& optimizer) {
    const torch::Tensor x = torch::randn({16, 4}, torch::kFloat64);  // from the global RNG, as dropout
    optimizer.zero_grad();
    model->forward(x).pow(2).mean().backward();
    optimizer.step();
  };
  torch::nn::Sequential model = make();
  model->to(torch::kFloat64);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  for (int i = 0; i < 3; ++i) train_step(model, optimizer);

  train::CheckpointState state;
  train::put_module(state, "model/", *model);
  train::put_optimizer(state, "optimizer/", optimizer, train::module_tensors(*model), 1);
  train::put_rng(state, torch::kCPU);
  std::vector<results::StepRecord> records(2);
  records[1].loss = 1.5;
  records[1].step = 42;
  state.put_records<results::StepRecord>("records/steps", records);
  const std::string path = dir.file(fmt::format("state-{}.safetensors", world_rank()));
  state.write(path);

  // The original continues two steps...
  for (int i = 0; i < 2; ++i) train_step(model, optimizer);
  // ...and a fresh model restored from the file continues the same two steps to the same values.
  torch::manual_seed(99);  // a different RNG stream, to be replaced by the checkpoint's
  torch::nn::Sequential restored = make();
  restored->to(torch::kFloat64);
  torch::optim::AdamW restored_optimizer(restored->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  const train::CheckpointState loaded(path);
  train::load_module(loaded, "model/", *restored);
  train::load_optimizer(loaded, "optimizer/", restored_optimizer, train::module_tensors(*restored));
  train::load_rng(loaded, torch::kCPU);
  for (int i = 0; i < 2; ++i) train_step(restored, restored_optimizer);
  EXPECT_TRUE(flat(model->parameters()).equal(flat(restored->parameters())));
  EXPECT_TRUE(flat(model->buffers()).equal(flat(restored->buffers())));
  const auto back = loaded.records<results::StepRecord>("records/steps");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].step, 42);
  EXPECT_EQ(back[1].loss, 1.5);

  // A model of another shape is refused, naming the file and the tensor.
  torch::nn::Sequential wider(torch::nn::Linear(4, 9));
  try {
    train::load_module(loaded, "model/", *wider);
    ADD_FAILURE() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(StopAgreement, EveryRankStopsAtTheSameStepBoundary) {
  runtime::clear_stop_request();
  runtime::StopAgreement agreement(MPI_COMM_WORLD);
  const int signalling_rank = world_size() - 1;
  int stopped_at = -1;
  for (int step = 0; step < 20; ++step) {
    if (step == 5 && world_rank() == signalling_rank) runtime::request_stop(SIGUSR1);
    if (agreement.poll()) {
      stopped_at = step;
      break;
    }
  }
  runtime::clear_stop_request();
  EXPECT_EQ(stopped_at, 6);  // the boundary after the one where the signal was first seen
  EXPECT_EQ(agreement.agreed_signal(), SIGUSR1);
  int lowest = stopped_at, highest = stopped_at;
  MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &highest, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(lowest, highest);
}

TEST(StopAgreement, NoSignalNoStop) {
  runtime::clear_stop_request();
  runtime::StopAgreement agreement(MPI_COMM_WORLD);
  for (int step = 0; step < 10; ++step) ASSERT_FALSE(agreement.poll());
  EXPECT_EQ(agreement.agreed_signal(), 0);
}

TEST(Agreement, EveryRankLearnsTheLowestFailingRankAndItsMessage) {
  const Agreement ok = agree(MPI_COMM_WORLD, "a stage that works", [] {});
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.failed_rank, -1);
  EXPECT_EQ(ok.error, "");
  // Every rank but 0 throws its own message: all agree on rank 1's.
  const Agreement failed = agree(MPI_COMM_WORLD, "a stage that fails", [] {
    if (world_rank() > 0) throw DataError("no such file on rank " + std::to_string(world_rank()));
  });
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.failed_rank, 1);
  EXPECT_EQ(failed.error, "no such file on rank 1");
  EXPECT_FALSE(failed.reported);  // the peers arrived at once
}

TEST(Agreement, AFailedRankWhosePeersAreLateSaysWhyWhileItWaits) {
  // Rank 0 is still in the stage (as in a collective HDF5 call the failed rank left) when the last
  // rank fails: the failed rank logs its error before the agreement completes.
  const int failing = world_size() - 1;
  const Agreement a = agree(MPI_COMM_WORLD, "a slow stage", [failing] {
    if (world_rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    if (world_rank() == failing) throw DataError("disk full");
  });
  EXPECT_EQ(a.failed_rank, failing);
  EXPECT_EQ(a.error, "disk full");
  EXPECT_EQ(a.reported, world_rank() == failing);
}

}  // namespace
}  // namespace mgbench::test
