#pragma once
// NCCL backend of the Communicator, bootstrapped over MPI (rank 0's ncclUniqueId is sent with
// MPI_Bcast, then ncclCommInitRankConfig), for CUDA tensors on this rank's GPU.
//
// Streams: every collective runs on the communicator's own high-priority stream. It first waits
// (cudaStreamWaitEvent) for an event recorded on the caller's current stream, so it sees the
// tensor's latest values; Work::wait() makes the caller's current stream wait for the
// collective's completion event. Neither blocks the host. The events come from a pool
// (runtime/event_pool.h): none is created or destroyed per collective once the pool has warmed up.
//
// Failure: the communicator is non-blocking (ncclConfig_t.blocking = 0), so no NCCL call blocks
// the host: where creation, a collective (its lazy connection on first use) or finalisation
// returns ncclInProgress, the rank polls ncclCommGetAsyncError until done or `timeout_s`. A
// watchdog thread polls asynchronous errors and the completion of every collective in flight. An
// error, or anything not done after `timeout_s`, means a peer died or hangs: the rank logs which
// operation, aborts the communicator (ncclCommAbort on a thread of its own, waited for at most
// 5 s: it can hang itself) and ends the job with MPI_Abort, so no rank waits forever. A CUDA
// error seen by the watchdog ends the job the same way. rank 0's failure to make the unique id
// fails every rank together. Teardown finalises with the same deadline and aborts past it.
// Follows the design of PyTorch's ProcessGroupNCCL (watchdog, async error handling, non-blocking
// communicators).
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
/// The NCCL loaded at run time (`linked`, ncclGetVersion) against the nccl.h mgbench was built with
/// (`built`, NCCL_VERSION_CODE; both major * 10000 + minor * 100 + patch): throws CommError
/// naming both (and LD_LIBRARY_PATH, the usual cause) when major or minor differ; returns a warning
/// for a patch difference, else "". Called when an NCCL communicator is created.
std::string check_nccl_version(int linked, int built);
/// The NCCL library's version ("2.27.7", from ncclGetVersion); "" without NCCL.
std::string nccl_version();

/// Creates the NCCL communicator over the ranks of comm (collective over comm), on CUDA device
/// `device_index` (which becomes this thread's current device). Throws CommError when NCCL is not
/// built in, or when NCCL or CUDA report an error during creation (with NCCL's message).
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, int device_index, NcclOptions options = {});

}  // namespace mgbench::runtime
