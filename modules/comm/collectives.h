#pragma once
// The collectives `mgbench comm` measures: one descriptor row per collective, as nccl-tests has one
// `struct testColl` per collective (src/all_reduce.cu, all_gather.cu, ...): its name, how a message
// size becomes element counts, its bus-bandwidth factor, how to launch it on a Communicator and what
// every rank must hold afterwards. A new collective is one row.
//
// Sizes and bandwidths follow nccl-tests (doc/PERFORMANCE.md):
//   size  = the whole message in bytes: all-reduce and broadcast, the buffer; all-gather, the output
//           (world_size x each rank's input); reduce-scatter, the input (world_size x each output);
//   algbw = size / time;  busbw = algbw x factor(n):
//           all-reduce 2(n-1)/n, all-gather (n-1)/n, reduce-scatter (n-1)/n, broadcast 1,
//   the bandwidth a link would need for a ring implementation, comparable across collectives and n.
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include <torch/types.h>

#include "core/option_table.h"
#include "runtime/communicator.h"

namespace mgbench::comm {

enum class Collective { kAllReduce, kAllGather, kReduceScatter, kBroadcast };

/// Element counts of one message on one rank.
struct MessageCounts {
  std::int64_t input = 0;   // elements of each rank's input
  std::int64_t output = 0;  // elements of each rank's output
  std::int64_t bytes = 0;   // nccl-tests' size (see above): count x element size of the whole message
  // In place, input and output are slices of one buffer of max(input, output) elements, starting at:
  std::int64_t in_place_input_offset = 0;   // all-gather: rank x input (NCCL's layout)
  std::int64_t in_place_output_offset = 0;  // reduce-scatter: rank x output
};

struct CollectiveInfo {
  std::string_view name;  // as typed: all-reduce
  Collective value;
  std::string_view help;
  bool reduces;  // takes --op
  bool rooted;   // takes --root
  /// nccl-tests' bus-bandwidth factor for n ranks.
  double (*bus_factor)(int world_size);
  /// The counts of a message of about `bytes` (rounded down to whole elements and, where the message
  /// is split over ranks, to a multiple of world_size elements; at least one element per rank).
  MessageCounts (*counts)(std::int64_t bytes, std::int64_t element_size, int world_size, int rank);
  /// Launches the collective on tensors of counts().input / .output elements (in place: slices of
  /// one buffer, see MessageCounts).
  std::unique_ptr<runtime::Work> (*launch)(runtime::Communicator& comm, const torch::Tensor& input,
                                           torch::Tensor& output, runtime::ReduceOp op, int root);
};

std::span<const CollectiveInfo> collective_choices();
const CollectiveInfo& collective_info(Collective c);

/// The value rank r's input holds at element i (as float64): 1 + (r + i) mod 3. Small integers, so
/// sums over up to 85 ranks are exact in every dtype measured (bfloat16 holds integers to 256).
torch::Tensor input_pattern(std::int64_t n, int rank, torch::ScalarType dtype, torch::Device device);

/// What rank `rank`'s output must hold after the collective over `world_size` ranks whose inputs are
/// input_pattern (float64 on the CPU): the independent expectation the check compares with.
torch::Tensor expected_output(const CollectiveInfo& c, const MessageCounts& counts, runtime::ReduceOp op, int root,
                              int rank, int world_size);

/// The memory one case of `mgbench comm` holds at its peak on each side of a rank [bytes]: its timed
/// buffers (input and output, out of place: `counts`' elements of `element_size` bytes) and, while
/// they are filled, the input pattern beside them (built on the host in the dtype, copied to the
/// device); with `check`, also the check's fresh buffers on the device and, on the host, the check's
/// input, the expected output in float64, the output copied to float64 and their comparison (17
/// bytes an output element) -- and on a GPU (`cuda`) the output's float64 conversion, made on the
/// device before its copy. On the CPU (`cuda` false) both are one memory: all of it is `host`.
struct CaseBytes {
  double device = 0, host = 0;
};
CaseBytes case_bytes(const MessageCounts& counts, std::int64_t element_size, bool check, bool cuda);

}  // namespace mgbench::comm
