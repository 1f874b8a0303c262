#pragma once
// Log-probabilities of target tokens under a language-model head, without the full logits:
// log p_i = log_softmax(h_i W^T)[t_i] in fp32 (TorchTune casts its logits to fp32 before the
// softmax: modules/transformer.py), computed a chunk of rows at a time and recomputed in backward
// (a fused linear + log-softmax, as Liger's fused linear cross-entropy), so that at most
// [chunk, vocab] fp32 logits exist at any moment, forward or backward -- with Llama 3's 128k
// vocabulary, full fp32 logits of a DPO micro-batch (2 x 4 x 1024 positions) would take 4 GiB, and
// autograd would keep the softmax as much again.
#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "models/row_gradient.h"

namespace mgbench::models {

/// The most logits target_log_probs holds at once by default [elements]: 2^26, 256 MiB of fp32
/// (523 rows of Llama 3's 128,256-word vocabulary).
inline constexpr std::int64_t kLogitsChunkElements = std::int64_t{1} << 26;

/// How the input's gradient is had when the head's weight is frozen (LoRA, QLoRA, DPO: no gradient
/// to the weight). kFactorInForward: forward also computes each row's d log p / d h = W[t] - p W
/// (p: the row's softmax), backward scales it by the incoming gradient -- no logits recomputed, one
/// GEMM of [N, V] x [V, H] in forward instead of two in backward (the logits' and the product's);
/// kept: [N, H] in hidden's dtype. kRecompute: backward recomputes each chunk's logits (always so
/// when the weight trains: its gradient needs them). kAuto: the factor where it applies.
enum class FrozenHeadGradient { kAuto, kFactorInForward, kRecompute };

/// hidden: [N, H] (the positions that have a target; any float dtype, with or without grad),
/// weight: [V, H] (the output projection; gradients flow to it when it requires grad), targets:
/// int64 [N] in [0, V). Returns float32 [N]: log_softmax(linear(hidden, weight).float())[targets].
/// Gradients equal those of that expression (the logits' gradient cast to weight's dtype before the
/// products, as autograd's; with the factor, the softmax's product with W is in W's dtype).
/// chunk_elements: the most logits held at once (rows = elements / V in forward; in backward
/// elements / the longest row range of a block). weight_gradient: where the weight's gradient goes
/// when it trains (nullptr: to autograd, whole). Then backward walks the sink's blocks, and in each
/// its row ranges, recomputing only their logits (each weight row read once per chunk of rows, as
/// without a sink); the input's gradient is the sum of the ranges' products, accumulated in fp32
/// (fp64 for fp64 inputs), each product rounded to the weight's dtype as autograd's whole product
/// is. Throws std::invalid_argument for mismatched shapes.
torch::Tensor target_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                               std::int64_t chunk_elements = kLogitsChunkElements,
                               FrozenHeadGradient frozen = FrozenHeadGradient::kAuto,
                               RowGradientSink* weight_gradient = nullptr);

}  // namespace mgbench::models
