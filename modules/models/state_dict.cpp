#include "models/state_dict.h"

#include <fstream>
#include <iterator>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/input_file.h"

namespace mgbench::models {

std::string shape_text(c10::IntArrayRef sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

std::map<std::string, torch::Tensor> state_dict(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) out.emplace(p.key(), p.value());
  for (const auto& b : module.named_buffers(/*recurse=*/true)) out.emplace(b.key(), b.value());
  return out;
}

void load_state_dict(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& tensors,
                     const std::string& source, bool strict) {
  auto targets = state_dict(module);
  if (strict) {
    for (const auto& [name, t] : tensors) {
      MGBENCH_REQUIRE(targets.count(name) != 0, DataError, "{}: unexpected tensor '{}' (not in the model)", source,
                      name);
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : targets) {
    const auto it = tensors.find(name);
    if (it == tensors.end()) {
      MGBENCH_REQUIRE(!strict, DataError, "{}: tensor '{}' missing", source, name);
      continue;
    }
    MGBENCH_REQUIRE(
        it->second.sizes() == target.sizes(), DataError, "{}: tensor '{}' has shape {}, the model expects {}", source,
        name, fmt::format("{}", fmt::join(it->second.sizes(), "x")), fmt::format("{}", fmt::join(target.sizes(), "x")));
    target.copy_(it->second);
  }
}

void to_device(torch::nn::Module& module, const torch::Device& device, torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  const auto move = [&](torch::Tensor& t) {
    t.set_data(t.data().to(device, t.is_floating_point() ? dtype : t.scalar_type()));
  };
  for (auto& p : module.parameters()) move(p);
  for (auto& b : module.buffers()) move(b);
}

void to_channels_last(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) {
    // Tensor::to, not contiguous(): a depthwise weight [C, 1, kH, kW] is contiguous in both layouts,
    // so contiguous() keeps its NCHW strides, and PyTorch then reads it as NCHW and picks oneDNN's
    // NCHW kernels (a GEMM-based weight gradient, reorders) for the whole depthwise convolution.
    // to() gives it channels_last strides, as Python's Module.to does.
    if (p.dim() == 4) {
      p.set_data(p.data().to(p.options(), /*non_blocking=*/false, /*copy=*/false, torch::MemoryFormat::ChannelsLast));
    }
  }
}

std::map<std::string, torch::Tensor> read_torch_state_dict(const std::string& path) {
  require_regular_file(path, "state dict");
  std::ifstream in(path, std::ios::binary);
  MGBENCH_REQUIRE(in.good(), DataError, "{}: cannot open", path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const c10::Error& e) {
    throw DataError(fmt::format("{}: not a file written by torch.save ({})", path, e.what_without_backtrace()));
  }
  MGBENCH_REQUIRE(value.isGenericDict(), DataError, "{}: expected a dict of tensors (a state_dict)", path);
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : value.toGenericDict()) {
    MGBENCH_REQUIRE(item.key().isString() && item.value().isTensor(), DataError,
                    "{}: expected a dict of name -> tensor", path);
    out.emplace(item.key().toStringRef(), item.value().toTensor());
  }
  return out;
}

}  // namespace mgbench::models
