#include <algorithm>
#include <cstring>
#include <map>
#include <string_view>

#include <torch/torch.h>

#include <fmt/format.h>

#include "runtime/communicator.h"

#include "core/error.h"
#include "runtime/nccl_transports.h"

namespace mgbench::runtime {

void check_collective(const torch::Tensor& input, const torch::Tensor& output, const char* backend, const char* op,
                      std::int64_t output_factor, std::int64_t input_factor) {
  for (const torch::Tensor* t : {&input, &output}) {
    MGBENCH_REQUIRE(t->is_contiguous(), CommError, "{} backend {}: tensor must be contiguous", backend, op);
  }
  MGBENCH_REQUIRE(input.scalar_type() == output.scalar_type(), CommError,
                  "{} backend {}: input {} and output {} differ in dtype", backend, op,
                  c10::toString(input.scalar_type()), c10::toString(output.scalar_type()));
  MGBENCH_REQUIRE(input.numel() * output_factor == output.numel() * input_factor, CommError,
                  "{} backend {}: input of {} elements and output of {} do not match", backend, op, input.numel(),
                  output.numel());
}

namespace {
std::map<torch::ScalarType, std::vector<torch::Tensor>> by_dtype(const std::vector<torch::Tensor>& tensors) {
  std::map<torch::ScalarType, std::vector<torch::Tensor>> groups;
  for (const auto& t : tensors) groups[t.scalar_type()].push_back(t);
  return groups;
}
}  // namespace

std::vector<std::int64_t> broadcast_coalesced_bytes(const std::vector<torch::Tensor>& tensors) {
  std::vector<std::int64_t> bytes;
  for (const auto& [dtype, group] : by_dtype(tensors)) {
    std::int64_t n = 0;
    for (const auto& t : group) n += t.numel() * static_cast<std::int64_t>(t.element_size());
    bytes.push_back(n);
  }
  return bytes;
}

void broadcast_coalesced(Communicator& comm, const std::vector<torch::Tensor>& tensors, int root) {
  if (comm.world_size() == 1) return;
  torch::NoGradGuard no_grad;
  for (auto& [dtype, group] : by_dtype(tensors)) {
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

namespace {

constexpr std::string_view kMore = ", ...";  // ends a transport list cut after a whole entry

/// `text` (a format_transports list) in at most `limit` bytes: whole entries, then kMore.
std::string cut_list(std::string text, std::size_t limit, bool cut) {
  if (!cut && text.size() <= limit) return text;
  const std::size_t room = limit - kMore.size();
  if (text.size() > room) {
    const std::size_t end = text.rfind(", ", room);
    text.resize(end == std::string::npos ? 0 : end);
  }
  return text + std::string(kMore);
}

}  // namespace

std::string gather_transports(Communicator& comm, const torch::Device& device, std::size_t max_bytes) {
  MGBENCH_REQUIRE(max_bytes >= 16, CommError, "gather_transports: max_bytes {} < 16", max_bytes);
  const auto n_bytes = static_cast<std::int64_t>(max_bytes);
  std::string mine = comm.transports();
  if (mine.rfind("unread:", 0) == 0) {
    mine.resize(std::min(mine.size(), max_bytes - 1));
  } else if (!mine.empty()) {
    mine = cut_list(mine, max_bytes - 1, false);
  }
  if (comm.world_size() == 1) return mine;
  torch::Tensor local = torch::zeros({n_bytes}, torch::kUInt8);
  std::copy(mine.begin(), mine.end(), local.data_ptr<std::uint8_t>());
  torch::Tensor all = torch::empty({comm.world_size() * n_bytes}, torch::TensorOptions(torch::kUInt8).device(device));
  torch::Tensor input = local.to(device);
  comm.all_gather(input, all)->wait();
  const torch::Tensor host = all.cpu();
  TransportCounts total;
  bool cut = false;
  for (int r = 0; r < comm.world_size(); ++r) {
    const char* text = reinterpret_cast<const char*>(host.data_ptr<std::uint8_t>() + r * n_bytes);
    std::string_view rank_text(text, ::strnlen(text, max_bytes));
    if (rank_text.rfind("unread:", 0) == 0) return std::string(rank_text);
    if (rank_text.empty()) return "";
    if (rank_text.ends_with(kMore)) {
      cut = true;
      rank_text.remove_suffix(kMore.size());
    }
    for (const auto& [name, n] : parse_transports(rank_text)) total[name] += n;
  }
  return cut_list(format_transports(total), max_bytes - 1, cut);
}

}  // namespace mgbench::runtime
