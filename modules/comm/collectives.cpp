#include "comm/collectives.h"

#include "axes/bus_bandwidth.h"

#include <algorithm>
#include <array>
#include <stdexcept>

namespace mgbench::comm {
namespace {

using runtime::Communicator;
using runtime::ReduceOp;
using runtime::Work;

std::int64_t elements(std::int64_t bytes, std::int64_t element_size) {
  return std::max<std::int64_t>(bytes / element_size, 1);
}

MessageCounts whole_buffer(std::int64_t bytes, std::int64_t element_size, int, int) {
  const std::int64_t n = elements(bytes, element_size);
  return {n, n, n * element_size, 0, 0};
}

MessageCounts gathered(std::int64_t bytes, std::int64_t element_size, int world_size, int rank) {
  const std::int64_t per_rank = std::max<std::int64_t>(elements(bytes, element_size) / world_size, 1);
  return {per_rank, per_rank * world_size, per_rank * world_size * element_size, rank * per_rank, 0};
}

MessageCounts scattered(std::int64_t bytes, std::int64_t element_size, int world_size, int rank) {
  const std::int64_t per_rank = std::max<std::int64_t>(elements(bytes, element_size) / world_size, 1);
  return {per_rank * world_size, per_rank, per_rank * world_size * element_size, 0, rank * per_rank};
}

std::unique_ptr<Work> launch_all_reduce(Communicator& comm, const torch::Tensor& in, torch::Tensor& out, ReduceOp op,
                                        int) {
  return comm.all_reduce(in, out, op);
}
std::unique_ptr<Work> launch_all_gather(Communicator& comm, const torch::Tensor& in, torch::Tensor& out, ReduceOp,
                                        int) {
  return comm.all_gather(in, out);
}
std::unique_ptr<Work> launch_reduce_scatter(Communicator& comm, const torch::Tensor& in, torch::Tensor& out,
                                            ReduceOp op, int) {
  return comm.reduce_scatter(in, out, op);
}
std::unique_ptr<Work> launch_broadcast(Communicator& comm, const torch::Tensor& in, torch::Tensor& out, ReduceOp,
                                       int root) {
  return comm.broadcast(in, out, root);
}

constexpr CollectiveInfo kCollectives[] = {
    {"all-reduce", Collective::kAllReduce, "every rank gets the reduction of all inputs (ncclAllReduce, MPI_Allreduce)",
     true, false, axes::all_reduce_bus_factor, whole_buffer, launch_all_reduce},
    {"all-gather", Collective::kAllGather, "every rank gets all inputs, in rank order (ncclAllGather, MPI_Allgather)",
     false, false, axes::gather_scatter_bus_factor, gathered, launch_all_gather},
    {"reduce-scatter", Collective::kReduceScatter,
     "rank r gets slice r of the reduction (ncclReduceScatter, MPI_Reduce_scatter_block)", true, false,
     axes::gather_scatter_bus_factor, scattered, launch_reduce_scatter},
    {"broadcast", Collective::kBroadcast, "every rank gets the root's input (ncclBroadcast, MPI_Bcast)", false, true,
     axes::broadcast_bus_factor, whole_buffer, launch_broadcast},
};

double pattern_value(int rank, std::int64_t i) { return 1.0 + static_cast<double>((rank + i) % 3); }

/// The reduction over ranks of pattern_value(r, i), for the three residues of i mod 3.
std::array<double, 3> reduced_by_residue(ReduceOp op, int world_size) {
  std::array<double, 3> out{};
  for (int residue = 0; residue < 3; ++residue) {
    double acc = pattern_value(0, residue);
    for (int r = 1; r < world_size; ++r) {
      const double v = pattern_value(r, residue);
      acc = op == ReduceOp::kSum ? acc + v : op == ReduceOp::kMax ? std::max(acc, v) : std::min(acc, v);
    }
    out[static_cast<std::size_t>(residue)] = acc;
  }
  return out;
}

/// table[(first + i) mod 3] for i in [0, n), as `dtype`: the period repeated, n elements (and at
/// most two more) in memory -- no index tensor (an int64 per element, and its temporaries: 32 bytes
/// an element where the result holds 2 to 8).
torch::Tensor periodic(const std::array<double, 3>& table, std::int64_t first, std::int64_t n,
                       torch::ScalarType dtype) {
  const auto at = [&](std::int64_t k) { return table[static_cast<std::size_t>((first + k) % 3)]; };
  const torch::Tensor period = torch::tensor({at(0), at(1), at(2)}, torch::kFloat64).to(dtype);
  return period.repeat({(n + 2) / 3}).narrow(0, 0, n);
}

}  // namespace

std::span<const CollectiveInfo> collective_choices() { return kCollectives; }

const CollectiveInfo& collective_info(Collective c) { return options::row_of(collective_choices(), c); }

torch::Tensor input_pattern(std::int64_t n, int rank, torch::ScalarType dtype, torch::Device device) {
  const std::array<double, 3> values{pattern_value(0, 0), pattern_value(0, 1), pattern_value(0, 2)};
  return periodic(values, rank, n, dtype).to(device);
}

torch::Tensor expected_output(const CollectiveInfo& c, const MessageCounts& counts, ReduceOp op, int root, int rank,
                              int world_size) {
  switch (c.value) {
    case Collective::kAllReduce:
      return periodic(reduced_by_residue(op, world_size), 0, counts.output, torch::kFloat64);
    case Collective::kReduceScatter:
      return periodic(reduced_by_residue(op, world_size), rank * counts.output, counts.output, torch::kFloat64);
    case Collective::kBroadcast:
      return input_pattern(counts.output, root, torch::kFloat64, torch::kCPU);
    case Collective::kAllGather: {
      std::vector<torch::Tensor> parts;
      for (int r = 0; r < world_size; ++r)
        parts.push_back(input_pattern(counts.input, r, torch::kFloat64, torch::kCPU));
      return torch::cat(parts);
    }
  }
  throw std::logic_error("expected_output: a collective without a rule");
}

CaseBytes case_bytes(const MessageCounts& counts, std::int64_t element_size, bool check, bool cuda) {
  const auto in = static_cast<double>(counts.input), out = static_cast<double>(counts.output);
  const auto es = static_cast<double>(element_size);
  CaseBytes b;
  b.device = check ? 2.0 * (in + out) * es + (cuda ? 8.0 * out : 0.0) : (2.0 * in + out) * es;
  b.host = in * es + (check ? 17.0 * out : 0.0);
  if (!cuda) b = {0.0, b.device + b.host};
  return b;
}

}  // namespace mgbench::comm
