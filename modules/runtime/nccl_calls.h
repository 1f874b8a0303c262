#pragma once
// NCCL's C API as the NCCL backend calls it: each call checked by a macro that throws CommError with
// the call, NCCL's error string and last error, and file:line; mgbench's dtypes and reduction
// operations as NCCL's. Internal to runtime/; NCCL builds only (MGBENCH_HAVE_NCCL).
#include <nccl.h>

#include <fmt/format.h>

#include "core/error.h"
#include "runtime/communicator.h"

/// Checks an NCCL call; throws CommError naming the call, NCCL's error string and last error, and file:line.
#define MGBENCH_CHECK_NCCL(call)                                                                                 \
  do {                                                                                                           \
    const ncclResult_t rc_ = (call);                                                                             \
    if (rc_ != ncclSuccess) {                                                                                    \
      throw ::mgbench::CommError(fmt::format("NCCL: {} failed: {} ({}) [{}:{}]", #call, ncclGetErrorString(rc_), \
                                             ncclGetLastError(nullptr), __FILE__, __LINE__));                    \
    }                                                                                                            \
  } while (0)

// An enqueue on a non-blocking communicator: ncclInProgress is not an error (settle() waits for it).
#define MGBENCH_CHECK_NCCL_ENQUEUE(call)                                                                         \
  do {                                                                                                           \
    const ncclResult_t rc_ = (call);                                                                             \
    if (rc_ != ncclSuccess && rc_ != ncclInProgress) {                                                           \
      throw ::mgbench::CommError(fmt::format("NCCL: {} failed: {} ({}) [{}:{}]", #call, ncclGetErrorString(rc_), \
                                             ncclGetLastError(nullptr), __FILE__, __LINE__));                    \
    }                                                                                                            \
  } while (0)

namespace mgbench::runtime {

/// NCCL's data type of a tensor dtype. Throws CommError naming the dtype when NCCL has none.
ncclDataType_t nccl_type(torch::ScalarType t);

/// NCCL's reduction operation of op.
ncclRedOp_t nccl_op(ReduceOp op);

}  // namespace mgbench::runtime
