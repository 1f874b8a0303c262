#include "models/nf4.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace mgbench::models {
namespace {

/// torchao's NF4 table, as written there (Dettmers et al.'s values to 4 decimals).
constexpr double kCodes[16] = {-1.0000, -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0911, 0.0000,
                               0.0796,  0.1609,  0.2461,  0.3379,  0.4407,  0.5626,  0.7230,  1.0000};

/// Elements whose nearest code is searched at once: the search holds [chunk, 16] differences, one
/// tensor of them (16 MiB in fp32). torchao searches 1Mi elements at once with two such tensors
/// (the difference and its abs): 128 MiB in fp32, the QLoRA set-up's peak above its weights.
constexpr std::int64_t kSearchChunk = std::int64_t{1} << 18;
/// Elements looked up at once in a 16-bit dtype's table: their int32 indices, 8 MiB.
constexpr std::int64_t kLookupChunk = std::int64_t{1} << 21;

/// Per block of `block` consecutive elements of a flat tensor, its absmax (torchao's get_block_absmax).
torch::Tensor block_absmax(const torch::Tensor& flat, std::int64_t block) {
  return std::get<0>(flat.view({flat.numel() / block, block}).abs().max(1));
}

/// Per element of `scaled` (1-D, dtype of `codes`), the index of its nearest code: argmin_k
/// |x - code_k| in that dtype, the first on ties (torchao's convert_to_norm_float_weight), searched
/// kSearchChunk elements at a time. uint8 [n].
torch::Tensor search_nearest_codes(const torch::Tensor& scaled, const torch::Tensor& codes) {
  const std::int64_t n = scaled.numel();
  torch::Tensor indices = torch::empty({n}, scaled.options().dtype(torch::kUInt8));
  for (std::int64_t start = 0; start < n; start += kSearchChunk) {
    const std::int64_t len = std::min(kSearchChunk, n - start);
    const torch::Tensor diff = (scaled.narrow(0, start, len).unsqueeze(-1) - codes).abs_();
    indices.narrow(0, start, len).copy_(std::get<1>(diff.min(-1)));
  }
  return indices;
}

/// A 16-bit dtype's value as the index of its bit pattern in a table of all 65,536: its bits read as
/// int16, + 32768. int32 [n].
torch::Tensor bit_pattern_index(const torch::Tensor& x) { return x.view(torch::kInt16).to(torch::kInt32).add_(32768); }

/// The tables of one (dtype, device), built once: the 16 codes, the 256 byte -> code pairs and, for
/// a 16-bit dtype, every value's nearest code.
struct CodeTables {
  torch::Tensor codes;    // [16]
  torch::Tensor pairs;    // [256, 2]: a byte's high-nibble code, then its low-nibble code
  torch::Tensor nearest;  // uint8 [65536] (bf16, fp16; undefined for fp32): by bit_pattern_index
};

const CodeTables& code_tables(torch::ScalarType dtype, torch::Device device) {
  // Never destroyed: CUDA tensors must not be freed after the driver has shut down at exit.
  static auto* tables = new std::map<std::pair<std::string, int>, CodeTables>();
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);  // autograd's device threads dequantise in backward
  const auto key = std::make_pair(device.str(), static_cast<int>(dtype));
  auto it = tables->find(key);
  if (it == tables->end()) {
    torch::NoGradGuard no_grad;
    CodeTables t;
    t.codes = torch::tensor(c10::ArrayRef<double>(kCodes, 16), torch::TensorOptions().dtype(torch::kFloat64))
                  .to(torch::TensorOptions().dtype(dtype).device(device));
    const torch::Tensor byte = torch::arange(256, torch::TensorOptions().dtype(torch::kInt64).device(device));
    t.pairs = torch::stack(
        {t.codes.index_select(0, byte.bitwise_right_shift(4)), t.codes.index_select(0, byte.bitwise_and(15))}, 1);
    if (c10::elementSize(dtype) == 2) {
      // The search run once over every value the dtype has (NaNs, infinities and ties included), on
      // this device with its kernels: a lookup then gives each element the index the search would.
      const torch::Tensor every_value =
          torch::arange(-32768, 32768, torch::TensorOptions().dtype(torch::kInt32).device(device))
              .to(torch::kInt16)
              .view(dtype);
      t.nearest = search_nearest_codes(every_value, t.codes);
    }
    it = tables->emplace(key, std::move(t)).first;
  }
  return it->second;
}

}  // namespace

torch::Tensor nf4_codes(torch::ScalarType dtype, torch::Device device) { return code_tables(dtype, device).codes; }

torch::Tensor nf4_code_pairs(torch::ScalarType dtype, torch::Device device) { return code_tables(dtype, device).pairs; }

Nf4Weight Nf4Weight::quantize(const torch::Tensor& weight) {
  const auto dtype = weight.scalar_type();
  MGBENCH_REQUIRE(dtype == torch::kBFloat16 || dtype == torch::kFloat16 || dtype == torch::kFloat32,
                  std::invalid_argument, "NF4: a weight of {} cannot be quantised (expected bf16, fp16 or fp32)",
                  c10::toString(dtype));
  MGBENCH_REQUIRE(weight.dim() >= 1 && weight.dim() <= 2, std::invalid_argument,
                  "NF4: expected a 1-D or 2-D weight, got [{}]", fmt::join(weight.sizes(), ", "));
  const std::int64_t n = weight.numel();
  MGBENCH_REQUIRE(n > 0 && n % kNumelMultiple == 0, std::invalid_argument,
                  "NF4: a weight of shape [{}] has {} elements, not a multiple of {} (blocks of {} x scaler blocks "
                  "of {}, as torchao requires)",
                  fmt::join(weight.sizes(), ", "), n, kNumelMultiple, kBlockSize, kScalerBlockSize);
  torch::NoGradGuard no_grad;
  const torch::Tensor flat = weight.detach().contiguous().flatten();
  const CodeTables& tables = code_tables(dtype, flat.device());
  Nf4Weight out;
  out.shape_ = weight.sizes().vec();
  out.dtype_ = dtype;

  // Double quantisation of the block absmaxes (torchao's double_quantize_scalers).
  const torch::Tensor absmax = block_absmax(flat, kBlockSize);  // [n / 64], dtype
  out.scaler_mean_ = absmax.mean();
  const torch::Tensor centred = absmax - out.scaler_mean_;
  const std::int64_t scaler_blocks = centred.numel() / kScalerBlockSize;
  const torch::Tensor factor = 256 / (2 * block_absmax(centred, kScalerBlockSize));  // [n / 16384], dtype
  out.quantized_scalers_ = (centred.view({scaler_blocks, kScalerBlockSize}) * factor.unsqueeze(-1))
                               .round()
                               .clamp(-128, 127)
                               .flatten()
                               .to(torch::kInt8);
  out.quantization_factor_ = factor.contiguous();

  // Nearest code of w / a_b with the raw absmax (torchao's convert_to_norm_float_weight). A 16-bit
  // dtype looks each element up in the table of its every value (one gather where the search computes
  // 16 differences: QLoRA's set-up of a 1.2B-parameter model on one CPU core 79 -> 23 s); fp32
  // searches, in chunks.
  const torch::Tensor scaled = (flat.view({n / kBlockSize, kBlockSize}) / absmax.unsqueeze(-1)).flatten();
  torch::Tensor indices;
  if (const torch::Tensor& nearest = tables.nearest; nearest.defined()) {
    indices = torch::empty({n}, flat.options().dtype(torch::kUInt8));
    for (std::int64_t start = 0; start < n; start += kLookupChunk) {
      const std::int64_t len = std::min(kLookupChunk, n - start);
      torch::Tensor out = indices.narrow(0, start, len);
      torch::index_select_out(out, nearest, 0, bit_pattern_index(scaled.narrow(0, start, len)));
    }
  } else {
    indices = search_nearest_codes(scaled, tables.codes);
  }
  const torch::Tensor pairs = indices.view({n / 2, 2});
  out.quantized_data_ = pairs.select(1, 0).bitwise_left_shift(4).bitwise_or(pairs.select(1, 1)).contiguous();
  return out;
}

torch::Tensor Nf4Weight::dequantize() const {
  MGBENCH_REQUIRE(defined(), std::logic_error, "NF4: dequantize of an empty weight");
  torch::NoGradGuard no_grad;
  const std::int64_t n = numel();
  const auto device = quantized_data_.device();
  // The block scalers as torchao's dequantize_scalers: (q / f).to(dtype) + mu.
  const torch::Tensor scalers =
      (quantized_scalers_.view({-1, kScalerBlockSize}) / quantization_factor_.unsqueeze(-1)).flatten().to(dtype_) +
      scaler_mean_;
  // A byte holds the indices of two consecutive elements: a 256-entry table of their code pairs
  // turns each byte into both values with one lookup.
  const torch::Tensor values =
      nf4_code_pairs(dtype_, device).index_select(0, quantized_data_.to(torch::kInt32));  // [n / 2, 2]
  return (values.view({n / kBlockSize, kBlockSize}) * scalers.unsqueeze(-1)).view(shape_);
}

void Nf4Weight::to(torch::Device device, bool non_blocking) {
  if (!defined() || device == quantized_data_.device()) return;
  quantized_data_ = quantized_data_.to(device, non_blocking);
  quantized_scalers_ = quantized_scalers_.to(device, non_blocking);
  quantization_factor_ = quantization_factor_.to(device, non_blocking);
  scaler_mean_ = scaler_mean_.to(device, non_blocking);
}

Nf4Weight Nf4Weight::from_parts(torch::Tensor quantized_data, torch::Tensor quantized_scalers,
                                torch::Tensor quantization_factor, torch::Tensor scaler_mean,
                                std::vector<std::int64_t> shape, torch::ScalarType dtype) {
  Nf4Weight w;
  w.quantized_data_ = std::move(quantized_data);
  w.quantized_scalers_ = std::move(quantized_scalers);
  w.quantization_factor_ = std::move(quantization_factor);
  w.scaler_mean_ = std::move(scaler_mean);
  w.shape_ = std::move(shape);
  w.dtype_ = dtype;
  const std::int64_t n = w.numel();
  MGBENCH_REQUIRE(n % kNumelMultiple == 0 && w.quantized_data_.numel() == n / 2 &&
                      w.quantized_scalers_.numel() == n / kBlockSize &&
                      w.quantization_factor_.numel() == n / kNumelMultiple && w.scaler_mean_.numel() == 1,
                  std::invalid_argument, "NF4: inner tensors do not fit the shape [{}]", fmt::join(w.shape_, ", "));
  return w;
}

std::int64_t Nf4Weight::numel() const {
  std::int64_t n = 1;
  for (const auto d : shape_) n *= d;
  return n;
}

std::int64_t Nf4Weight::nbytes() const {
  if (!defined()) return 0;
  return static_cast<std::int64_t>(quantized_data_.nbytes() + quantized_scalers_.nbytes() +
                                   quantization_factor_.nbytes() + scaler_mean_.nbytes());
}

std::int64_t Nf4Weight::sharded_nbytes(std::int64_t numel, std::int64_t dtype_bytes) {
  return numel / 2 + numel / kBlockSize + numel / kNumelMultiple * dtype_bytes;
}

}  // namespace mgbench::models
