#pragma once
// Helpers of the tests that run under mpirun (labels mpi and gpu).
#include <mpi.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "../unit/test_support.h"
#include "core/progress.h"
#include "results/writer.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/mpi_communicator.h"
#include "train/image_trainer.h"

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
    if (world_rank() == 0) std::filesystem::remove_all(path_);
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

inline train::ImageConfig small_config(const std::string& strategy, std::int64_t batch_size) {
  train::ImageConfig c;
  c.data_dir = test::shared_data_dir() + "/mnist";
  c.image_size = 32;
  c.limit_train = 96;  // divisible by 2 x 8 and 3 x 8: every batch full
  c.limit_test = 60;
  c.strategy = strategy;
  c.epochs = 2;
  c.batch_size = batch_size;
  c.width_mult = 0.25;
  c.threads = 1;
  c.lr = 0.02;
  return c;
}

struct Trained {
  std::vector<torch::Tensor> parameters;
  std::vector<torch::Tensor> buffers;
};

/// Trains config on the ranks of communicator's job; placement: the rank's device.
inline Trained train_run(runtime::Communicator& communicator, MPI_Comm comm, const train::ImageConfig& config,
                         const std::string& results, runtime::DevicePlacement placement = {}) {
  train::ImageTrainer trainer(config, communicator, 1, placement);
  trainer.load_data();
  results::ResultsWriter writer(results, comm, config.strategy, trainer.run_attributes(), trainer.rank_attributes(),
                                trainer.layout());
  Progress quiet(false, "img/s");
  trainer.run(writer, quiet);
  writer.finish(results::kStatusCompleted);
  return {trainer.parameters(), trainer.buffers()};
}

inline Trained train_run(MPI_Comm comm, const train::ImageConfig& config, const std::string& results) {
  runtime::MpiCommunicator communicator(comm);
  return train_run(communicator, comm, config, results);
}

inline bool have_data() { return std::filesystem::exists(test::shared_data_dir() + "/mnist"); }

}  // namespace mgbench::test
