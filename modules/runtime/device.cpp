#include "runtime/device.h"

#include <sched.h>

#include <thread>

#include <algorithm>

#include <fmt/format.h>

#include "core/config.h"
#include "core/error.h"

#if MGBENCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mgbench::runtime {

int machine_cores() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return machine_cores();
  return std::max(1, CPU_COUNT(&set));
}

namespace {

constexpr options::Choice<DeviceRequest> kDevices[] = {
    {"auto", DeviceRequest::kAuto, "the GPU of the rank's local rank when GPUs are visible, else the CPU"},
    {"cuda", DeviceRequest::kCuda, "the GPU of the rank's local rank (an error without one)"},
    {"cpu", DeviceRequest::kCpu, "the CPU"},
};

}  // namespace

std::span<const options::Choice<DeviceRequest>> device_choices() { return kDevices; }

std::string DevicePlacement::str() const { return is_cuda() ? fmt::format("cuda:{}", index) : "cpu"; }

DevicePlacement place_rank(DeviceRequest requested, int visible_gpus, int local_rank) {
  if (requested == DeviceRequest::kCpu || (requested == DeviceRequest::kAuto && visible_gpus == 0)) {
    return {DeviceKind::kCpu, -1};
  }
  MGBENCH_REQUIRE(visible_gpus > 0, ConfigError,
                  "--device cuda: no CUDA device is visible to this rank (check the driver, CUDA_VISIBLE_DEVICES "
                  "and the job's GPU request, e.g. --gpus-per-node); use --device cpu to run on the CPU");
  return {DeviceKind::kCuda, local_rank % visible_gpus};
}

std::string single_device_warning(const std::vector<int>& visible, const std::string& hostname) {
  if (visible.size() < 2 || std::any_of(visible.begin(), visible.end(), [](int n) { return n != 1; })) return {};
  return fmt::format(
      "each of the {} ranks on {} sees a single GPU (per-task device confinement: SLURM --gpus-per-task with "
      "cgroup ConstrainDevices, or CUDA_VISIBLE_DEVICES per rank): NCCL cannot detect NVLink or peer-to-peer "
      "between them (NVIDIA/nccl#1066) and may take slower paths; allocate the node's GPUs to all its tasks "
      "(--gpus-per-node) and let each rank pick its GPU by local rank",
      visible.size(), hostname);
}

#if MGBENCH_HAVE_CUDA
void initialise_device(const DevicePlacement& placement) {
  if (!placement.is_cuda()) return;
  cudaError_t rc = cudaSetDevice(placement.index);
  const char* call = "cudaSetDevice";
  if (rc == cudaSuccess) {
    rc = cudaFree(nullptr);  // creates the context
    call = "creating its context (cudaFree(nullptr))";
  }
  if (rc != cudaSuccess) {
    cudaGetLastError();
    throw Error(
        fmt::format("{} ({}): {} failed: {} (an exclusive-process GPU another process holds, a faulty GPU "
                    "or a driver mismatch; nvidia-smi shows the GPU's compute mode and processes)",
                    placement.str(), cuda_pci_bus_id(placement.index), call, cudaGetErrorString(rc)));
  }
}

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

CudaDeviceModel cuda_device_model(int index) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  return {p.name, p.multiProcessorCount};
}

std::int64_t cuda_total_memory(int index) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<std::int64_t>(p.totalGlobalMem);
}

namespace {
std::string cuda_version_text(int v) { return v > 0 ? fmt::format("{}.{}", v / 1000, (v % 1000) / 10) : ""; }
}  // namespace

std::string cuda_runtime_version() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) cudaGetLastError();
  return cuda_version_text(v);
}

std::string cuda_driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) cudaGetLastError();
  return cuda_version_text(v);
}
#else
void initialise_device(const DevicePlacement& placement) {
  MGBENCH_REQUIRE(!placement.is_cuda(), Error, "{}: this mgbench was built without CUDA", placement.str());
}
std::string cuda_runtime_version() { return ""; }
std::string cuda_driver_version() { return ""; }
int visible_cuda_devices() { return 0; }
std::string cuda_pci_bus_id(int index) { return fmt::format("none:{}", index); }
std::string cuda_device_description(int) { return ""; }
std::int64_t cuda_total_memory(int) { return 0; }
CudaDeviceModel cuda_device_model(int) { return {}; }
#endif

}  // namespace mgbench::runtime
