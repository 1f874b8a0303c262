// The MPI Communicator's all-reduce (runtime/mpi_communicator.h: queued to its communication thread,
// MPI_Iallreduce driven there, the caller waiting on the Work) against its peer in the same run,
// a plain blocking MPI_Allreduce on the caller's thread, across message sizes: what the thread
// hand-off costs, and from what size it stops mattering.
//   mpirun -np 2 --bind-to none build/bench/mgbench_micro_comm [--benchmark_filter=...]
// Every rank runs the same benchmarks with a fixed iteration count (collectives must match across
// ranks; Google Benchmark's adaptive count could differ per rank); rank 0 reports.
#include <benchmark/benchmark.h>
#include <mpi.h>
#include <torch/torch.h>

#include <memory>

#include "runtime/mpi_communicator.h"

namespace {

constexpr std::int64_t kIterations = 200;

std::unique_ptr<mgbench::runtime::MpiCommunicator>& communicator() {
  static std::unique_ptr<mgbench::runtime::MpiCommunicator> comm;
  return comm;
}

void BM_CommunicatorAllReduce(benchmark::State& state) {
  torch::Tensor t = torch::ones({state.range(0) / 4}, torch::kFloat32);
  for (auto _ : state) communicator()->all_reduce(t, mgbench::runtime::ReduceOp::kSum)->wait();
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

void BM_MpiAllreduce(benchmark::State& state) {
  torch::Tensor t = torch::ones({state.range(0) / 4}, torch::kFloat32);
  for (auto _ : state) {
    MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(t.numel()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

BENCHMARK(BM_CommunicatorAllReduce)->RangeMultiplier(16)->Range(64, 64 << 20)->Iterations(kIterations)->UseRealTime();
BENCHMARK(BM_MpiAllreduce)->RangeMultiplier(16)->Range(64, 64 << 20)->Iterations(kIterations)->UseRealTime();

class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  torch::set_num_threads(1);
  communicator() = std::make_unique<mgbench::runtime::MpiCommunicator>(MPI_COMM_WORLD);
  benchmark::Initialize(&argc, argv);
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    NullReporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  communicator().reset();
  benchmark::Shutdown();
  MPI_Finalize();
  return 0;
}
