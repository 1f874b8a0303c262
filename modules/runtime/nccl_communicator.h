#pragma once
// NCCL backend of the Communicator, bootstrapped over MPI (rank 0's ncclUniqueId is sent with
// MPI_Bcast, then ncclCommInitRank), for CUDA tensors on this rank's GPU.
//
// Streams: every collective runs on the communicator's own high-priority stream. It first waits
// (cudaStreamWaitEvent) for an event recorded on the caller's current stream, so it sees the
// tensor's latest values; Work::wait() makes the caller's current stream wait for the
// collective's completion event. Neither blocks the host.
//
// Failure: a watchdog thread polls ncclCommGetAsyncError and the completion of every collective
// in flight. An asynchronous NCCL error, or a collective (or the communicator's creation) not
// finished after `timeout_s`, means a peer died or hangs: the watchdog logs which operation,
// aborts the communicator (ncclCommAbort) and ends the job with MPI_Abort, so no rank waits
// forever. Follows the design of PyTorch's ProcessGroupNCCL (watchdog, async error handling).
//
// The NCCL library is the one LibTorch itself loads (the nvidia-nccl pip package next to the
// torch wheel; cmake/Dependencies.cmake links that very file), never a second copy.
#include <mpi.h>

#include <memory>
#include <string>

#include "runtime/communicator.h"

namespace mgbench::runtime {

struct NcclOptions {
  double timeout_s = 600;  // a collective in flight longer than this aborts the job
};

/// True when mgbench was built with NCCL (a CUDA build).
bool nccl_built();
/// The NCCL library's version ("2.27.7", from ncclGetVersion); "" without NCCL.
std::string nccl_version();

/// Creates the NCCL communicator over the ranks of comm (collective over comm), on CUDA device
/// `device_index` (which becomes this thread's current device). Throws CommError when NCCL is not
/// built in, or when NCCL or CUDA report an error during creation (with NCCL's message).
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, int device_index, NcclOptions options = {});

}  // namespace mgbench::runtime
