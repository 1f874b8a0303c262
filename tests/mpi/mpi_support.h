#pragma once
// Helpers of the tests that run under mpirun (labels mpi and gpu).
#include <mpi.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../unit/test_support.h"
#include "core/progress.h"
#include "results/writer.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/mpi_communicator.h"
#include "train/checkpoint/run_state.h"
#include "train/job_config.h"
#include "train/loop.h"

namespace mgbench::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// A directory shared by all ranks (rank 0 creates it), removed by rank 0 at scope exit.
class SharedDir {
 public:
  SharedDir() {
    char path[256] = {};
    if (world_rank() == 0) {
      std::string tmpl = (std::filesystem::temp_directory_path() / "mgbench-mpi-XXXXXX").string();
      std::snprintf(path, sizeof(path), "%s", mkdtemp(tmpl.data()));
    }
    MPI_Bcast(path, sizeof(path), MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = path;
  }
  ~SharedDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) remove_quietly(path_);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline torch::Tensor flat(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> parts;
  for (const auto& t : tensors) parts.push_back(t.detach().to(torch::kFloat64).reshape({-1}));
  return torch::cat(parts);
}

/// max over ranks of |x - x on rank 0|
inline double max_difference_across_ranks(runtime::Communicator& comm, const torch::Tensor& x) {
  torch::Tensor reference = x.clone();
  comm.broadcast(reference, 0)->wait();
  torch::Tensor diff = (x - reference).abs().max().reshape({1});
  comm.all_reduce(diff, runtime::ReduceOp::kMax)->wait();
  return diff.item<double>();
}

/// The shared data's tokenizer and text rows of the LLM jobs of the tests (llm_config): the small
/// tokenizer; HH-RLHF pairs for the dpo recipe, alpaca rows for the others.
inline std::string llm_tokenizer_file() { return test::shared_data_dir() + "/llama3/tiktoken_small.model"; }
inline std::string llm_data_file(const std::string& recipe) {
  return test::shared_data_dir() + (recipe == "dpo" ? "/text/dpo/hh_rlhf_harmless_base_test.jsonl.gz"
                                                    : "/text/alpaca/alpaca_cleaned_first5k.json");
}

/// The inputs of llm_config's jobs with `model` (an oracle directory), every recipe's: for
/// MGBENCH_REQUIRE_INPUTS.
inline std::vector<std::string> llm_inputs(const std::string& model) {
  return {model, llm_tokenizer_file(), llm_data_file("lora"), llm_data_file("dpo")};
}

/// The shared MNIST directory of the image jobs.
inline std::string mnist_dir() { return test::shared_data_dir() + "/mnist"; }

/// Option values by name, as the command line would give them.
using Settings = std::vector<std::pair<std::string, std::string>>;

/// The image job of the MPI tests: 96 MNIST images (divisible by 2 x 8 and 3 x 8: every batch
/// full) at 32 px, a quarter-width MobileNetV2, 2 epochs; then `more`.
inline std::unique_ptr<train::JobConfig> small_config(const std::string& strategy, std::int64_t batch_size,
                                                      const Settings& more = {}) {
  auto c = train::configure("image");
  for (const auto& [name, value] : Settings{{"data", mnist_dir()},
                                            {"image-size", "32"},
                                            {"limit-train", "96"},
                                            {"limit-test", "60"},
                                            {"strategy", strategy},
                                            {"epochs", "2"},
                                            {"batch-size", std::to_string(batch_size)},
                                            {"width-mult", "0.25"},
                                            {"threads", "1"},
                                            {"lr", "0.02"},
                                            {"device", "cpu"}}) {
    c->set(name, value);
  }
  for (const auto& [name, value] : more) c->set(name, value);
  return c;
}

/// The LLM jobs of the tests: the tiny Llama oracle (tests/python/make_oracles.py) with its small
/// tokenizer, 3 optimizer steps of batch_size x 2 in fp32 on the CPU; the lora recipe on alpaca rows,
/// the dpo recipe on HH-RLHF pairs (24 rows per rank); then `more`. One thread a rank, as for the
/// image job: train_run's default placement says one rank on the node, so each of 3 ranks on 2 cores
/// took both cores' threads and spent three quarters of the CPU in OpenMP's barrier spins (perf).
inline std::unique_ptr<train::JobConfig> llm_config(const std::string& recipe, const std::string& model,
                                                    std::int64_t batch_size, const std::string& results,
                                                    const Settings& more = {}) {
  auto c = train::configure("llm", recipe);
  const Settings data =
      recipe == "dpo"
          ? Settings{{"dataset", "hh_rlhf"}, {"data", llm_data_file(recipe)}, {"activation-checkpointing", "false"}}
          : Settings{{"dataset", "alpaca"}, {"data", llm_data_file(recipe)}};
  for (const auto& [name, value] : Settings{{"model", model},
                                            {"tokenizer", llm_tokenizer_file()},
                                            {"limit", std::to_string(24 * world_size())},
                                            {"batch-size", std::to_string(batch_size)},
                                            {"grad-accum", "2"},
                                            {"max-steps", "3"},
                                            {"warmup-steps", "1"},
                                            {"lr", "1e-3"},
                                            {"threads", "1"},
                                            {"precision", "fp32"},
                                            {"device", "cpu"},
                                            {"results", results}}) {
    c->set(name, value);
  }
  // --lora-* only where the recipe trains adapters (full, qat: refused).
  if (c->table.find("finetune")->text() == "lora") c->set("lora-rank", "4");
  for (const auto& [name, value] : data) c->set(name, value);
  for (const auto& [name, value] : more) c->set(name, value);
  return c;
}

inline std::unique_ptr<train::JobConfig> lora_config(const std::string& model, std::int64_t batch_size,
                                                     const std::string& results, const Settings& more = {}) {
  return llm_config("lora", model, batch_size, results, more);
}

struct Trained {
  std::vector<torch::Tensor> parameters;  // the trained ones, whole (gathered under FSDP)
  std::vector<torch::Tensor> buffers;
  results::RunSummary summary;
};

/// Runs config's job in this process on the ranks of comm, through the training loop (the job's
/// agreement stages and checkpoints left out); placement: the rank's device.
inline Trained train_run(runtime::Communicator& communicator, MPI_Comm comm, train::JobConfig& config,
                         const std::string& results, runtime::DevicePlacement placement = {}) {
  config.set("results", results);
  config.validate();
  train::TrainingLoop loop(config.train, *config.recipe, communicator, placement, {});
  h5::Attributes attributes = config.table.attributes();  // the options, then what the loop resolved
  for (auto&& a : loop.run_attributes()) attributes.push_back(std::move(a));
  results::ResultsWriter writer(results, comm, config.recipe_name, attributes, loop.rank_attributes(), loop.layout());
  Progress quiet(false, loop.throughput_unit());
  train::RunControl control;
  const results::RunSummary summary = loop.run(writer, quiet, control);
  writer.finish(results::kStatusCompleted);
  return {loop.trained_parameters(), config.recipe->model().buffers(), summary};
}

inline Trained train_run(MPI_Comm comm, train::JobConfig& config, const std::string& results) {
  runtime::MpiCommunicator communicator(comm);
  return train_run(communicator, comm, config, results);
}

}  // namespace mgbench::test
