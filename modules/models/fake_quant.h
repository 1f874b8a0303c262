#pragma once
// Quantisation-aware training with torchao 0.11's 8da4w scheme (Int8DynActInt4WeightQATQuantizer,
// torchao/quantization/qat/{linear,fake_quantizer,utils}.py and quant_primitives.py), the
// quantizer of TorchTune's qat_distributed and qat_lora_finetune_distributed recipes:
// y = linear(fq_a(x), fq_w(W)), activations int8 per token (asymmetric, dynamic), weights int4 per
// group of in-features (symmetric). Fake quantisation rounds in the forward and passes gradients
// straight through (torchao's _GenericFakeQuantize: its mask is taken after the clamp, so it is
// all ones for finite values; here it is ones everywhere -- a NaN input gets its gradient through
// instead of zero, in a run that has diverged already).
#include <cstdint>

#include <torch/torch.h>

namespace mgbench::models {

/// Per token (last dimension), asymmetric int8 in [-128, 127], dynamic: mn = min(row min, 0),
/// mx = max(row max, 0) in x's dtype; s = max((mx - mn) / 255, eps(dtype)); zp = clamp(-128 -
/// round(mn / s), -128, 127); s, zp as fp32; q = clamp(round(x * (1 / s)) + zp, -128, 127);
/// returns ((q - zp).to(dtype) * s).to(dtype), x's shape and dtype (bf16, fp16, fp32 or fp64), with a
/// straight-through gradient. Throws std::invalid_argument for another dtype.
torch::Tensor fake_quantize_per_token_int8(const torch::Tensor& x);

/// Per group of group_size consecutive elements of each row, symmetric int4 in [-8, 7]:
/// s = max(max|w_g| / 7.5, eps(dtype)) in w's dtype, then fp32, zero point 0; the same quantise and
/// dequantise. w: [out, in] with in % group_size == 0; returns w's shape and dtype, with a
/// straight-through gradient. Throws std::invalid_argument for a group size < 2 or not dividing in.
torch::Tensor fake_quantize_per_group_int4(const torch::Tensor& w, std::int64_t group_size);

/// A weight converted to int4 (torchao's convert of Int8DynActInt4WeightQATQuantizer, which fixes
/// what fake_quantize_per_group_int4 simulated).
struct Int4GroupWeight {
  torch::Tensor values;  // int8 [out, in], each in [-8, 7]
  torch::Tensor scales;  // fp32 [out, in / group_size]
  torch::Tensor zeros;   // fp32 [out, in / group_size], all 0 (symmetric)
};
/// q = clamp(round(w * (1 / s) + zp), -8, 7) with the scales of fake_quantize_per_group_int4.
/// Throws std::invalid_argument as that, or for a weight holding NaN.
Int4GroupWeight quantize_per_group_int4(const torch::Tensor& w, std::int64_t group_size);

/// Two int4 values per byte, the first (even column) in the high nibble, as two's complement:
/// values int8 [out, in] in [-8, 7], in even -> uint8 [out, in / 2]. Throws std::invalid_argument.
torch::Tensor pack_int4(const torch::Tensor& values);
/// The inverse of pack_int4: uint8 [out, in / 2] -> int8 [out, in].
torch::Tensor unpack_int4(const torch::Tensor& packed);

}  // namespace mgbench::models
