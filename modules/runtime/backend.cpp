#include "runtime/backend.h"

#include <map>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/option_table.h"
#include "runtime/mpi_communicator.h"
#include "runtime/mpi_env.h"
#include "runtime/nccl_communicator.h"

namespace mgbench::runtime {
namespace {

// The factories and versions of the rows. The device index is NCCL's; MPI stages CUDA tensors
// through host memory on whatever device they are.
std::unique_ptr<Communicator> make_mpi(MPI_Comm comm, int /*device_index*/, double timeout_s) {
  return std::make_unique<MpiCommunicator>(comm, timeout_s);
}
std::unique_ptr<Communicator> make_nccl(MPI_Comm comm, int device_index, double timeout_s) {
  return make_nccl_communicator(comm, device_index, {timeout_s});  // throws in a build without NCCL
}
bool always_built() { return true; }
std::string nccl_library_version() { return "NCCL " + nccl_version(); }

constexpr BackendInfo kBackends[] = {
    {"auto", Backend::kAuto, "nccl on GPUs, mpi on the CPU", "", "", nullptr, nullptr, false, false, false, nullptr},
    {"nccl", Backend::kNccl, "NCCL, bootstrapped over MPI (one GPU per rank)", "NCCL", "CUDA/NCCL", &nccl_built,
     &make_nccl, /*needs_cuda=*/true, /*shares_gpu=*/false, /*in_comm=*/true, &nccl_library_version},
    {"mpi", Backend::kMpi, "MPI; GPU tensors are staged through host memory (ranks may share a GPU)", "MPI", "MPI",
     &always_built, &make_mpi, /*needs_cuda=*/false, /*shares_gpu=*/true, /*in_comm=*/true, &mpi_library_version},
};

/// The first built backend of rows (auto's row aside) that `fits`, or nullptr.
template <typename Fits>
const BackendInfo* find_built(std::span<const BackendInfo> rows, Fits fits) {
  for (const BackendInfo& b : rows) {
    if (b.make != nullptr && b.built() && fits(b)) return &b;
  }
  return nullptr;
}

/// What auto takes on the device: on a GPU its own library first. The table always has a CPU
/// backend that shares GPUs (mpi); one without is a programming error.
const BackendInfo& auto_backend(const DevicePlacement& device, std::span<const BackendInfo> rows) {
  const BackendInfo* b = nullptr;
  if (device.is_cuda()) b = find_built(rows, [](const BackendInfo& r) { return r.needs_cuda; });
  if (b == nullptr) b = find_built(rows, [](const BackendInfo& r) { return !r.needs_cuda; });
  if (b == nullptr) throw std::logic_error("the backend table has no backend for the CPU");
  return *b;
}

}  // namespace

std::span<const BackendInfo> backend_choices() { return kBackends; }
const BackendInfo& backend_info(Backend backend) { return options::row_of(backend_choices(), backend); }
std::string_view backend_name(Backend backend) { return backend_info(backend).name; }

Backend resolve_backend(Backend requested, const DevicePlacement& device, std::span<const BackendInfo> rows) {
  if (requested == Backend::kAuto) return auto_backend(device, rows).value;
  const BackendInfo& b = options::row_of(rows, requested);
  MGBENCH_REQUIRE(b.built(), ConfigError, "--backend {}: this mgbench was built without {}", b.name, b.build_needs);
  MGBENCH_REQUIRE(!b.needs_cuda || device.is_cuda(), ConfigError,
                  "--backend {} needs GPUs, but this rank runs on the CPU (--device); use --backend {}", b.name,
                  auto_backend(DevicePlacement{}, rows).name);
  return requested;
}

int check_gpu_sharing(const std::vector<std::string>& gpu_ids, int local_rank, Backend backend,
                      const std::string& hostname) {
  std::map<std::string, std::vector<int>> ranks_of;
  for (std::size_t r = 0; r < gpu_ids.size(); ++r) ranks_of[gpu_ids[r]].push_back(static_cast<int>(r));
  const BackendInfo& b = backend_info(backend);
  if (!b.shares_gpu) {
    const BackendInfo* sharing = find_built(backend_choices(), [](const BackendInfo& r) { return r.shares_gpu; });
    if (sharing == nullptr) throw std::logic_error("the backend table has no backend that shares a GPU");
    for (const auto& [id, ranks] : ranks_of) {
      MGBENCH_REQUIRE(ranks.size() == 1, ConfigError,
                      "{} ranks on node {} but only {} GPU(s): local ranks {} would share GPU {}, which {} does "
                      "not allow. Start at most one rank per GPU (srun --ntasks-per-node / --gpus-per-task=1, mpirun "
                      "-npernode), or use --backend {} to share a GPU (for tests; it stages through host memory)",
                      gpu_ids.size(), hostname, ranks_of.size(), fmt::join(ranks, ", "), id, b.library, sharing->name);
    }
  }
  return static_cast<int>(ranks_of[gpu_ids.at(static_cast<std::size_t>(local_rank))].size());
}

}  // namespace mgbench::runtime
