#include <map>

#include <torch/torch.h>

#include "runtime/communicator.h"

namespace mgbench::runtime {

void broadcast_coalesced(Communicator& comm, const std::vector<torch::Tensor>& tensors, int root) {
  if (comm.world_size() == 1) return;
  std::map<torch::ScalarType, std::vector<torch::Tensor>> by_dtype;
  for (const auto& t : tensors) by_dtype[t.scalar_type()].push_back(t);
  torch::NoGradGuard no_grad;
  for (auto& [dtype, group] : by_dtype) {
    std::vector<torch::Tensor> flat_parts;
    for (const auto& t : group) flat_parts.push_back(t.detach().reshape({-1}));
    torch::Tensor flat = torch::cat(flat_parts);
    comm.broadcast(flat, root)->wait();
    std::int64_t offset = 0;
    for (auto& t : group) {
      t.detach().copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

}  // namespace mgbench::runtime
