#include "core/config.h"

#if MGBENCH_HAVE_NCCL

#include "runtime/nccl_calls.h"

namespace mgbench::runtime {

ncclDataType_t nccl_type(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return ncclFloat32;
    case torch::kFloat64:
      return ncclFloat64;
    case torch::kHalf:
      return ncclFloat16;
    case torch::kBFloat16:
      return ncclBfloat16;
    case torch::kInt32:
      return ncclInt32;
    case torch::kInt64:
      return ncclInt64;
    case torch::kUInt8:
      return ncclUint8;
    default:
      throw CommError(fmt::format("NCCL backend: dtype {} is not supported", c10::toString(t)));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

}  // namespace mgbench::runtime

#endif  // MGBENCH_HAVE_NCCL
