#pragma once
// Loading and saving a module's parameters and buffers by name, in PyTorch's state_dict naming
// (e.g. "features.0.0.weight"), from files written by Python's torch.save(model.state_dict()).
#include <map>
#include <string>

#include <torch/torch.h>

namespace mgbench::models {

/// A tensor's shape as text, "[2, 3]" (for messages).
std::string shape_text(c10::IntArrayRef sizes);

/// Named parameters and buffers of module (buffers such as BatchNorm running statistics included).
std::map<std::string, torch::Tensor> state_dict(const torch::nn::Module& module);

/// Copies tensors into module's parameters and buffers by name (dtype converted to the module's).
/// strict: every name of module must be present and no extra name allowed. Throws DataError
/// naming `source` and the first missing / unexpected name or the mismatched shape.
void load_state_dict(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& tensors,
                     const std::string& source, bool strict = true);

/// Moves module's parameters and buffers to `device` and casts the floating-point ones to `dtype`,
/// as Python's module.to(device, dtype) does; integer buffers (BatchNorm's num_batches_tracked,
/// int64) keep their dtype (LibTorch's Module::to(device, dtype) would cast them too).
void to_device(torch::nn::Module& module, const torch::Device& device, torch::ScalarType dtype);

/// Converts every 4-D parameter (convolution weights) of module to channels_last (NHWC) memory
/// layout in place, as Python's module.to(memory_format=torch.channels_last): also those contiguous
/// in both layouts (depthwise [C, 1, kH, kW]) get channels_last strides (C stride 1).
void to_channels_last(torch::nn::Module& module);

/// Reads a dict of tensors written by torch.save(state_dict) (zip format) at path.
/// Throws DataError naming the file when it cannot be read or is not a dict of tensors.
std::map<std::string, torch::Tensor> read_torch_state_dict(const std::string& path);

}  // namespace mgbench::models
