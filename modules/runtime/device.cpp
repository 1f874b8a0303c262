#include "runtime/device.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/config.h"
#include "core/error.h"

#ifdef MGBENCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mgbench::runtime {

std::string DevicePlacement::str() const { return is_cuda() ? fmt::format("cuda:{}", index) : "cpu"; }

DevicePlacement place_rank(const std::string& requested, int visible_gpus, int local_rank) {
  MGBENCH_REQUIRE(requested == "auto" || requested == "cuda" || requested == "cpu", ConfigError,
                  "--device '{}': expected auto, cuda or cpu", requested);
  if (requested == "cpu" || (requested == "auto" && visible_gpus == 0)) return {DeviceKind::kCpu, -1};
  MGBENCH_REQUIRE(visible_gpus > 0, ConfigError,
                  "--device cuda: no CUDA device is visible to this rank (check the driver, CUDA_VISIBLE_DEVICES "
                  "and the job's GPU request, e.g. --gpus-per-node); use --device cpu to run on the CPU");
  return {DeviceKind::kCuda, local_rank % visible_gpus};
}

std::string resolve_backend(const std::string& requested, const DevicePlacement& device, bool nccl_built) {
  MGBENCH_REQUIRE(requested == "auto" || requested == "nccl" || requested == "mpi", ConfigError,
                  "--backend '{}': expected auto, nccl or mpi", requested);
  if (requested == "auto") return device.is_cuda() && nccl_built ? "nccl" : "mpi";
  if (requested == "nccl") {
    MGBENCH_REQUIRE(nccl_built, ConfigError, "--backend nccl: this mgbench was built without CUDA/NCCL");
    MGBENCH_REQUIRE(device.is_cuda(), ConfigError,
                    "--backend nccl needs GPUs, but this rank runs on the CPU (--device); use --backend mpi");
  }
  return requested;
}

int check_gpu_sharing(const std::vector<std::string>& gpu_ids, int local_rank, const std::string& backend,
                      const std::string& hostname) {
  std::map<std::string, std::vector<int>> ranks_of;
  for (std::size_t r = 0; r < gpu_ids.size(); ++r) ranks_of[gpu_ids[r]].push_back(static_cast<int>(r));
  if (backend == "nccl") {
    for (const auto& [id, ranks] : ranks_of) {
      MGBENCH_REQUIRE(ranks.size() == 1, ConfigError,
                      "{} ranks on node {} but only {} GPU(s): local ranks {} would share GPU {}, which NCCL does "
                      "not allow. Start at most one rank per GPU (srun --ntasks-per-node / --gpus-per-task=1, mpirun "
                      "-npernode), or use --backend mpi to share a GPU (for tests; it stages through host memory)",
                      gpu_ids.size(), hostname, ranks_of.size(), fmt::join(ranks, ", "), id);
    }
  }
  return static_cast<int>(ranks_of[gpu_ids.at(static_cast<std::size_t>(local_rank))].size());
}

#ifdef MGBENCH_HAVE_CUDA
int visible_cuda_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return n;
}

std::string cuda_pci_bus_id(int index) {
  char id[32] = {};
  if (cudaDeviceGetPCIBusId(id, sizeof(id), index) != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("unknown:{}", index);
  }
  return id;
}

std::string cuda_device_description(int index) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return fmt::format("{}, {:.1f} GiB, sm_{}{}", p.name, static_cast<double>(p.totalGlobalMem) / (1 << 30), p.major,
                     p.minor);
}
#else
int visible_cuda_devices() { return 0; }
std::string cuda_pci_bus_id(int index) { return fmt::format("none:{}", index); }
std::string cuda_device_description(int) { return ""; }
#endif

}  // namespace mgbench::runtime
