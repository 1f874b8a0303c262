#pragma once
// NF4: QLoRA's 4-bit NormalFloat weights with double-quantised block scales (Dettmers et al. 2023),
// exactly as torchao 0.11 stores and computes them (torchao/dtypes/nf4tensor.py: to_nf4,
// NF4Tensor.get_original_weight, linear_nf4), the base weights of TorchTune's QLoRA
// (lora_llama3_8b(quantize_base=True)).
//
// Layout of a weight w of numel n (n % 16384 == 0, as torchao requires -- no tail handling):
//   - per block of 64 consecutive elements (row-major), the absmax a_b;
//   - each element's index: argmin_k |w / a_b - code_k| (first on ties), computed in w's dtype, with
//     the 16 NF4 codes cast to w's dtype; two indices per byte, the first element in the high nibble;
//   - the scalers double-quantised: mu = mean(a), c = a - mu; per block of 256 scalers
//     f = 256 / (2 max|c|), q = clamp(round-half-even(c f), -128, 127) as int8;
//   - dequantised: code[index] * ((q / f).to(dtype) + mu). Quantisation used the raw a_b, the
//     dequantisation the double-quantised scaler: torchao's asymmetry, reproduced.
// 4 bits + 8 / 64 + 16 / 16384 bits per element in bf16: ~4.13 bits per parameter.
#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace mgbench::models {

class Nf4Weight {
 public:
  static constexpr std::int64_t kBlockSize = 64;         // elements per absmax scaler
  static constexpr std::int64_t kScalerBlockSize = 256;  // scalers per quantisation factor
  /// numel must be a multiple of this (torchao's requirement).
  static constexpr std::int64_t kNumelMultiple = kBlockSize * kScalerBlockSize;

  Nf4Weight() = default;
  /// Quantises weight (bf16, fp16 or fp32, 1-D or 2-D) on its device, bitwise equal to torchao's to_nf4
  /// on CPU (bf16 / fp16: each index looked up in a table of the search run on every 16-bit value).
  /// Throws std::invalid_argument for another dtype or rank, or a numel not a multiple of 16384.
  static Nf4Weight quantize(const torch::Tensor& weight);
  /// From torchao's inner tensors (a checkpoint, a saved graph). Throws std::invalid_argument when
  /// their sizes do not fit shape.
  static Nf4Weight from_parts(torch::Tensor quantized_data, torch::Tensor quantized_scalers,
                              torch::Tensor quantization_factor, torch::Tensor scaler_mean,
                              std::vector<std::int64_t> shape, torch::ScalarType dtype);

  /// The weight as it computes: [shape] in the original dtype, on the packed data's device
  /// (torchao's get_original_weight, bitwise): one LibTorch operation chain whose temporaries are
  /// one int32 index per byte and the weight itself (no int64 index per element, as torchao's).
  torch::Tensor dequantize() const;

  /// Moves the packed tensors (not their dtypes) to device.
  void to(torch::Device device, bool non_blocking = false);

  bool defined() const { return quantized_data_.defined(); }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  torch::ScalarType dtype() const { return dtype_; }
  torch::Device device() const { return quantized_data_.device(); }
  std::int64_t numel() const;
  /// Bytes held: packed indices, int8 scalers, factors and the mean.
  std::int64_t nbytes() const;
  /// Bytes of the parts FSDP shards (packed indices, scalers, factors: not the mean, which every
  /// rank keeps) of a weight of numel elements whose dtype has dtype_bytes.
  static std::int64_t sharded_nbytes(std::int64_t numel, std::int64_t dtype_bytes);

  // torchao's inner tensors, under its names.
  const torch::Tensor& quantized_data() const { return quantized_data_; }            // uint8 [numel / 2]
  const torch::Tensor& quantized_scalers() const { return quantized_scalers_; }      // int8 [numel / 64]
  const torch::Tensor& quantization_factor() const { return quantization_factor_; }  // dtype [numel / 16384]
  const torch::Tensor& scaler_mean() const { return scaler_mean_; }                  // dtype []

 private:
  torch::Tensor quantized_data_, quantized_scalers_, quantization_factor_, scaler_mean_;
  std::vector<std::int64_t> shape_;
  torch::ScalarType dtype_ = torch::kBFloat16;
};

/// The 16 NF4 code values (torchao's table) in dtype on device: built once per (dtype, device)
/// and kept there, as torchao keeps its table on the weight's device (no host copy, no stream
/// synchronisation per layer call). Shared: read-only.
torch::Tensor nf4_codes(torch::ScalarType dtype, torch::Device device);
/// [256, 2] in dtype on device: for each byte, the codes of its high and low nibble (two packed
/// indices at once in dequantize). Built once per (dtype, device), like nf4_codes. Read-only.
torch::Tensor nf4_code_pairs(torch::ScalarType dtype, torch::Device device);

}  // namespace mgbench::models
