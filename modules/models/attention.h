#pragma once
// Causal self-attention of the Llama decoder: scaled_dot_product_attention's kernels, with packed
// sequences (one varlen flash call on a GPU) and, on the CPU, query chunks that skip the masked
// half of the square, as one autograd node.
#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace mgbench::models {

/// Sequences packed one after another into a row of S positions, as attention takes them: each run
/// attends within itself only. Made where the batch is collated (on the loader thread), so that a
/// step on a GPU copies its cumulative lengths to the device once with the batch, not in every layer.
struct PackedRuns {
  std::vector<std::int64_t> lengths;  // positions of each run, in order, summing to S (on the host)
  /// int32 [N + 1]: 0 and each run's end (flash attention's cumulative sequence lengths), on the
  /// device of q for one copy a micro-batch (the batch's); on the host it is copied at each call.
  torch::Tensor cu_seqlens;
  /// A bound on the runs' lengths, >= the longest (flash's grid over query blocks, its blocks past a
  /// run's end returning at once): the longest run, or S for a layout whose every batch of one shape
  /// must launch the same kernels (a CUDA graph's replay).
  std::int64_t max_length = 0;

  /// The runs of `lengths`: cu_seqlens int32 [N + 1] on the host (pinned when asked), max_length the
  /// longest (or `bound` when it is given: a static bound, at least the longest). Throws
  /// std::invalid_argument for no runs, a negative length, a bound below the longest or positions
  /// past int32.
  static PackedRuns of(std::vector<std::int64_t> lengths, bool pin_memory = false, std::int64_t bound = 0);
};

/// Causal self-attention of q [B, H, T, D] over k, v [B, H_kv, T, D] (H a multiple of H_kv: grouped-
/// query attention, each K/V head shared by H / H_kv query heads): softmax(q k^T / sqrt(D) + causal
/// mask) v, [B, H, T, D] -- scaled_dot_product_attention(is_causal=True, enable_gqa). On the CPU,
/// whose flash kernel computes every key block a query block meets (blocks of up to 512 keys),
/// sequences of 512 tokens or more go as four query chunks, each against only the keys up to its
/// last position with the diagonal block masked: ~5/8 of the square's work, forward and backward
/// (shorter ones in one call: chunks measured no faster there on 2 threads); all the chunks and
/// sequences of a call are one autograd node calling the CPU flash kernel forward and backward
/// (SDPA's own CPU kernel, without a graph of slices and concatenations around it). runs (packed
/// sequences, B = 1, SequencePacking): T is the runs, each attending within itself only -- on a GPU
/// where flash attention applies (flash_varlen_applies) one varlen call for them all on
/// runs->cu_seqlens, else one call per sequence on the host's lengths (which a CUDA graph's capture
/// refuses: std::runtime_error). Throws std::invalid_argument when the lengths do not sum to T, else
/// what scaled_dot_product_attention throws.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const PackedRuns* runs = nullptr);

/// Whether torch's flash-attention kernel can run q [B, H, T, D], k, v [B, H_kv, T, D] causally
/// (sdp::can_use_flash_attention, the test scaled_dot_product_attention applies to its flash
/// backend: a CUDA device of the architectures the kernel supports, fp16 / bf16, the head dimension,
/// the flash flag on), whichever backend SDPA itself would pick first (cuDNN on H100 / H200 with
/// torch 2.11): then the kernel's varlen entry takes packed sequences in one call. False on the CPU
/// and in builds without CUDA.
bool flash_varlen_applies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

/// Causal attention within each of the packed sequences q [1, H, S, D], k, v [1, H_kv, S, D] (runs
/// summing to S) in one flash-attention call: at::_flash_attention_forward with the runs'
/// cumulative lengths (on q's device: no copy; on the host: copied) and max_length
/// (torch.nn.attention.varlen's varlen_attn; flash-attn's flash_attn_varlen_func), GQA by the
/// kernel itself; autograd through its backward. Reads nothing on the host but the shapes and
/// max_length: a CUDA graph captures it. Returns [1, H, S, D]. Only where flash_varlen_applies.
/// Throws std::invalid_argument when the shapes or the runs disagree, c10::Error from the kernel.
torch::Tensor flash_varlen_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                            const PackedRuns& runs);

}  // namespace mgbench::models
