#pragma once
// The communication backends (--backend), one descriptor row each, in the manner of nccl-tests'
// testColl: what the rest of mgbench needs to know of a backend -- how to create its Communicator,
// whether it needs CUDA, whether ranks may share a GPU under it, whether `mgbench comm` measures
// it, its library's version -- so that no caller compares backends by name or enum value. `auto`
// is a row too (for --help and parsing) and is resolved from the others' properties.
// Adding a backend: its enum value here, its row (and its factory) in backend.cpp, its
// Communicator in <name>_communicator.cpp (docs/design.md, "How to add ...").
#include <mpi.h>

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/device.h"

namespace mgbench::runtime {

class Communicator;

/// --backend: the communication library of the collectives. After resolve_backend: never kAuto.
enum class Backend { kAuto, kNccl, kMpi };

/// Creates a backend's Communicator over the ranks of comm (collective over comm) on the rank's
/// device (device_index: the CUDA ordinal, -1 on the CPU); timeout_s: --comm-timeout [s], how long
/// a collective may stay in flight. Throws what the backend's constructor throws (CommError).
using CommunicatorFactory = std::unique_ptr<Communicator> (*)(MPI_Comm comm, int device_index, double timeout_s);

/// A row of the backend table. The `auto` row has no factory, and nothing else but its name and help.
struct BackendInfo {
  std::string_view name;  // --backend
  Backend value;
  std::string_view help;
  std::string_view library;      // the library as messages name it: "NCCL"
  std::string_view build_needs;  // what a build needs to have it: "CUDA/NCCL" ("this mgbench was built without ...")
  bool (*built)();               // compiled into this binary
  CommunicatorFactory make;
  bool needs_cuda;           // CUDA tensors only: refused on the CPU
  bool shares_gpu;           // several ranks of a node may use one GPU
  bool in_comm;              // `mgbench comm` measures it
  std::string (*version)();  // its library and version, as `mgbench comm` prints it: "NCCL 2.27.7"
};

/// Every backend, `auto` first; the others in order of preference (what `auto` takes first).
std::span<const BackendInfo> backend_choices();
/// The row of backend (a logic_error for a value without one).
const BackendInfo& backend_info(Backend backend);
/// "auto", "nccl", "mpi".
std::string_view backend_name(Backend backend);

/// Resolves --backend for a device from the rows (tests pass rows whose `built` differs).
/// auto: on a GPU the first built row that needs CUDA (the GPUs' own library: nccl), else, or on
/// the CPU, the first built row that does not (mpi). Never returns kAuto. Throws ConfigError for a
/// backend not built in ("--backend nccl: this mgbench was built without CUDA/NCCL"), or one that
/// needs CUDA on a CPU rank (naming the backend auto takes on the CPU instead).
Backend resolve_backend(Backend requested, const DevicePlacement& device,
                        std::span<const BackendInfo> rows = backend_choices());

/// gpu_ids: the physical id (PCI bus id) of each local rank's GPU, in local-rank order, as
/// gathered over the node (MpiEnvironment::node_allgather). Under a backend whose row does not
/// share GPUs (NCCL cannot place two ranks of one communicator on one GPU) a repeated id throws
/// ConfigError naming the ranks, the GPU, the number of GPUs and the way out (fewer ranks per node,
/// or the first backend that shares: --backend mpi). Returns the number of local ranks sharing this
/// rank's GPU (1 = exclusive).
int check_gpu_sharing(const std::vector<std::string>& gpu_ids, int local_rank, Backend backend,
                      const std::string& hostname);

}  // namespace mgbench::runtime
