#pragma once
// Rank -> device binding: one MPI rank per GPU, chosen by local rank (the rank's index among
// the ranks of its node, from MPI_Comm_split_type). The communication backend that goes with the
// device: runtime/backend.h. No LibTorch here.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/option_table.h"

namespace mgbench::runtime {

/// --device: where a rank computes.
enum class DeviceRequest { kAuto, kCuda, kCpu };
std::span<const options::Choice<DeviceRequest>> device_choices();

enum class DeviceKind { kCpu, kCuda };

struct DevicePlacement {
  DeviceKind kind = DeviceKind::kCpu;
  int index = -1;  // CUDA device ordinal among the visible devices; -1 on the CPU
  /// The node's ranks placed on this rank's GPU, itself included (check_gpu_sharing's count, set by
  /// session::connect; 2 under `--backend mpi` with two ranks a GPU): a plan measured against the
  /// GPU's memory gives the rank this share of it. 1 on the CPU.
  int ranks_on_device = 1;

  bool is_cuda() const { return kind == DeviceKind::kCuda; }
  /// "cpu" or "cuda:N".
  std::string str() const;
};

/// Chooses this rank's device (auto = cuda when a GPU is visible). visible_gpus: CUDA devices visible to this process
/// (after CUDA_VISIBLE_DEVICES; 1 per rank under `srun --gpus-per-task=1`). A GPU rank takes visible device local_rank
/// % visible_gpus: with per-node visibility that is local_rank; whether two ranks of a node ended up on one physical
/// GPU is decided by check_gpu_sharing (runtime/backend.h). Throws ConfigError for --device cuda without a visible GPU.
DevicePlacement place_rank(DeviceRequest requested, int visible_gpus, int local_rank);

/// visible: the CUDA devices each local rank of a node sees, in local-rank order (gathered over the
/// node). Where two or more ranks each see one device -- a site confining each task's devices
/// (SLURM --gpus-per-task with cgroup ConstrainDevices), or CUDA_VISIBLE_DEVICES set per rank --
/// NCCL cannot detect NVLink or peer-to-peer between them (NVIDIA/nccl#1066: it must see all the
/// node's GPUs) and falls back to slower paths: the warning saying so and what to ask instead; ""
/// otherwise (one rank on the node, or ranks that see several devices).
std::string single_device_warning(const std::vector<int>& visible, const std::string& hostname);

/// CUDA devices visible to this process (0 without a CUDA build, driver or device).
int visible_cuda_devices();
/// Makes placement's GPU this thread's device and creates its CUDA context (cudaSetDevice, then
/// cudaFree(nullptr)): a rank's first CUDA calls, which fail on an exclusive-process GPU another
/// process holds, a faulty GPU or a driver mismatch -- done in a set-up stage of their own, agreed
/// over the ranks, before any collective that a failing rank would leave its peers waiting in.
/// Nothing on the CPU. Throws Error naming the device and CUDA's message.
void initialise_device(const DevicePlacement& placement);
/// PCI bus id of a visible CUDA device ("0000:3b:00.0"); "" without CUDA.
std::string cuda_pci_bus_id(int index);
/// Cores of the machine (std::thread::hardware_concurrency), at least 1.
int machine_cores();
/// Cores this process may run on: its CPU affinity (sched_getaffinity), which launchers set
/// (Open MPI binds each rank to one core when np <= 2, to a socket above; srun to
/// --cpus-per-task), at least 1.
int available_cores();

/// Human-readable description ("NVIDIA H100 80GB HBM3, 79.2 GiB, sm_90"); "" without CUDA.
std::string cuda_device_description(int index);
/// Bytes of memory of a visible CUDA device; 0 without CUDA.
std::int64_t cuda_total_memory(int index);
/// cudaDeviceProp::name ("NVIDIA H100 80GB HBM3") and multiProcessorCount of a visible CUDA
/// device, the keys of the MFU peak table (runtime/peak_flops.h); {"", 0} without CUDA.
struct CudaDeviceModel {
  std::string name;
  int sm_count = 0;
};
CudaDeviceModel cuda_device_model(int index);
/// The CUDA runtime this binary uses and the driver's CUDA version, "13.0" / "13.1"; "" without
/// CUDA (or, for the driver, without a driver).
std::string cuda_runtime_version();
std::string cuda_driver_version();

}  // namespace mgbench::runtime
