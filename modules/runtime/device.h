#pragma once
// Rank -> device binding: one MPI rank per GPU, chosen by local rank (the rank's index among
// the ranks of its node, from MPI_Comm_split_type), and the communication backend that goes
// with the device. No LibTorch here.
#include <string>
#include <vector>

namespace mgbench::runtime {

enum class DeviceKind { kCpu, kCuda };

struct DevicePlacement {
  DeviceKind kind = DeviceKind::kCpu;
  int index = -1;  // CUDA device ordinal among the visible devices; -1 on the CPU

  bool is_cuda() const { return kind == DeviceKind::kCuda; }
  /// "cpu" or "cuda:N".
  std::string str() const;
};

/// Chooses this rank's device. requested: auto | cuda | cpu (auto = cuda when a GPU is
/// visible). visible_gpus: CUDA devices visible to this process (after CUDA_VISIBLE_DEVICES;
/// 1 per rank under `srun --gpus-per-task=1`). A GPU rank takes visible device
/// local_rank % visible_gpus: with per-node visibility that is local_rank; whether two ranks of
/// a node ended up on one physical GPU is decided by check_gpu_sharing.
/// Throws ConfigError for an unknown value, or --device cuda without a visible GPU.
DevicePlacement place_rank(const std::string& requested, int visible_gpus, int local_rank);

/// Resolves --backend auto | nccl | mpi for a device: auto = nccl on GPUs (when built with
/// NCCL), mpi on the CPU. Throws ConfigError for an unknown value, nccl on the CPU, or nccl in
/// a build without NCCL.
std::string resolve_backend(const std::string& requested, const DevicePlacement& device, bool nccl_built);

/// gpu_ids: the physical id (PCI bus id) of each local rank's GPU, in local-rank order, as
/// gathered over the node (MpiEnvironment::node_allgather). NCCL cannot place two ranks of one communicator on one GPU:
/// with backend "nccl" a repeated id throws ConfigError naming the ranks, the GPU, the number of GPUs and the way out
/// (fewer ranks per node, or --backend mpi). With "mpi" sharing is allowed. Returns the number of local ranks sharing
/// this rank's GPU (1 = exclusive).
int check_gpu_sharing(const std::vector<std::string>& gpu_ids, int local_rank, const std::string& backend,
                      const std::string& hostname);

/// CUDA devices visible to this process (0 without a CUDA build, driver or device).
int visible_cuda_devices();
/// PCI bus id of a visible CUDA device ("0000:3b:00.0"); "" without CUDA.
std::string cuda_pci_bus_id(int index);
/// Human-readable description ("NVIDIA H100 80GB HBM3, 79.2 GiB, sm_90"); "" without CUDA.
std::string cuda_device_description(int index);

}  // namespace mgbench::runtime
