#include "models/attention.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <optional>
#include <vector>

#include "core/config.h"
#include "core/error.h"
#include "models/state_dict.h"

#if MGBENCH_HAVE_CUDA
#include <ATen/native/transformers/cuda/sdp_utils.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace mgbench::models {
namespace {

using torch::Tensor;

/// One call of the CPU flash kernel: queries [q_start, q_start + q_len) against keys
/// [k_start, k_start + k_len) (k_start + k_len = q_start + q_len: the queries are the last of the
/// keys); offset = q_start - k_start, the keys each query sees beyond its own position in the
/// segment (0: is_causal; else a mask).
struct Segment {
  std::int64_t q_start, q_len, k_start, k_len;
  bool all_keys;  // the sequence's last chunk: it sees every key of the sequence
  std::int64_t offset() const { return q_start - k_start; }
};

/// Positions [start, start + len) of dim 2 (T of [B, H, T, D] and of the logsumexp's [B, H, T]) as
/// one as_strided op: narrow dispatches narrow, slice and as_strided, three host round trips for
/// the same view, and the node takes nine such views per chunk.
Tensor positions(const Tensor& t, std::int64_t start, std::int64_t len) {
  std::vector<std::int64_t> sizes = t.sizes().vec();
  sizes[2] = len;
  return t.as_strided(sizes, t.strides(), t.storage_offset() + start * t.stride(2));
}

/// The calls for sequences of `lengths` positions one after another: one per sequence below 512
/// positions, four query chunks from 512 on (docs/benchmarks.md, "chunked causal attention"), a
/// sequence's last chunk first (backward writes its key gradients, the others add to them).
std::vector<Segment> segments_of(c10::IntArrayRef lengths) {
  constexpr std::int64_t kChunks = 4, kShortest = 512;
  std::vector<Segment> out;
  std::int64_t start = 0;
  for (const std::int64_t n : lengths) {
    const std::int64_t chunk = n < kShortest ? n : (n + kChunks - 1) / kChunks;
    for (std::int64_t c = (n - 1) / chunk * chunk; c >= 0; c -= chunk) {
      const std::int64_t end = std::min(n, c + chunk);
      out.push_back({start + c, end - c, start, end, end == n});
    }
    start += n;
  }
  return out;
}

/// The additive mask of a chunk with offset s: query i sees keys 0 .. s + i ([q_len, k_len], -inf
/// above that diagonal); none (is_causal) for offset 0. The last few shapes' masks are kept per
/// thread: a step's chunks come in a few shapes that every layer repeats, forward and backward.
std::optional<Tensor> chunk_mask(const Segment& s, const torch::TensorOptions& options) {
  if (s.offset() == 0) return std::nullopt;
  struct Kept {
    std::int64_t q_len, k_len, offset;
    torch::ScalarType dtype;
    Tensor mask;
  };
  constexpr std::size_t kKept = 8;  // at most 8 x [T / 4, T]: 32 MiB of fp32 at T = 2048
  thread_local std::deque<Kept> kept;
  const torch::ScalarType dtype = options.dtype().toScalarType();
  for (const Kept& k : kept) {
    if (k.q_len == s.q_len && k.k_len == s.k_len && k.offset == s.offset() && k.dtype == dtype) return k.mask;
  }
  kept.push_front(
      {s.q_len, s.k_len, s.offset(), dtype,
       torch::full({s.q_len, s.k_len}, -std::numeric_limits<double>::infinity(), options).triu(s.offset() + 1)});
  if (kept.size() > kKept) kept.pop_back();
  return kept.front().mask;
}

/// Causal attention on the CPU over a list of segments as one autograd node:
/// at::_scaled_dot_product_flash_attention_for_cpu per segment forward (its logsumexp kept), and
/// its _backward per segment, the key / value gradients of a sequence's chunks summed.
class CpuCausalAttention : public torch::autograd::Function<CpuCausalAttention> {
 public:
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const std::vector<std::int64_t>& lengths) {
    const std::vector<Segment> segments = segments_of(lengths);
    Tensor out, lse;
    if (segments.size() == 1) {
      std::tie(out, lse) = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, /*is_causal=*/true);
    } else {
      out = at::empty(q.sizes(), q.options());
      for (const Segment& s : segments) {
        const auto [o, l] = at::_scaled_dot_product_flash_attention_for_cpu(
            positions(q, s.q_start, s.q_len), positions(k, s.k_start, s.k_len), positions(v, s.k_start, s.k_len), 0.0,
            /*is_causal=*/s.offset() == 0, chunk_mask(s, q.options()));
        if (!lse.defined()) lse = at::empty({q.size(0), q.size(1), q.size(2)}, l.options());
        positions(out, s.q_start, s.q_len).copy_(o);
        positions(lse, s.q_start, s.q_len).copy_(l);
      }
    }
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["lengths"] = lengths;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const Tensor& g = grad_outputs[0];
    const std::vector<Segment> segments = segments_of(ctx->saved_data["lengths"].toIntVector());
    if (segments.size() == 1) {
      const auto [dq, dk, dv] =
          at::_scaled_dot_product_flash_attention_for_cpu_backward(g, q, k, v, out, lse, 0.0, /*is_causal=*/true);
      return {dq, dk, dv, Tensor()};
    }
    const Tensor dq = at::empty(q.sizes(), q.options()), dk = at::empty(k.sizes(), k.options()),
                 dv = at::empty(v.sizes(), v.options());
    for (const Segment& s : segments) {
      const auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
          positions(g, s.q_start, s.q_len), positions(q, s.q_start, s.q_len), positions(k, s.k_start, s.k_len),
          positions(v, s.k_start, s.k_len), positions(out, s.q_start, s.q_len), positions(lse, s.q_start, s.q_len), 0.0,
          /*is_causal=*/s.offset() == 0, chunk_mask(s, q.options()));
      positions(dq, s.q_start, s.q_len).copy_(gq);
      if (s.all_keys) {  // the sequence's first segment: every key of it
        positions(dk, s.k_start, s.k_len).copy_(gk);
        positions(dv, s.k_start, s.k_len).copy_(gv);
      } else {
        positions(dk, s.k_start, s.k_len).add_(gk);
        positions(dv, s.k_start, s.k_len).add_(gv);
      }
    }
    return {dq, dk, dv, Tensor()};
  }
};

}  // namespace

bool flash_varlen_applies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  if (!q.is_cuda()) return false;
#if MGBENCH_HAVE_CUDA
  // Flash's own admission test, not SDPA's first choice: torch 2.11 with cuDNN > 9.15 ranks cuDNN
  // attention first on sm90 / sm100 (H100, H200, B200), where _fused_sdp_choice never says flash.
  const sdp::sdp_params params{q,
                               k,
                               v,
                               /*attn_mask=*/std::nullopt,
                               /*dropout=*/0.0,
                               /*is_causal=*/true,
                               /*enable_gqa=*/q.size(1) != k.size(1)};
  return sdp::can_use_flash_attention(params, /*debug=*/false);
#else
  return false;
#endif
}

torch::Tensor flash_varlen_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                            const PackedRuns& runs) {
  const auto n = static_cast<std::int64_t>(runs.lengths.size());
  MGBENCH_REQUIRE(q.dim() == 4 && q.size(0) == 1 && k.size(0) == 1 && v.size(0) == 1 && n > 0 &&
                      runs.cu_seqlens.dim() == 1 && runs.cu_seqlens.size(0) == n + 1 &&
                      runs.cu_seqlens.scalar_type() == torch::kInt32 && runs.max_length > 0,
                  std::invalid_argument,
                  "flash_varlen_causal_attention: packed q, k, v [1, H, S, D], {} runs and their cumulative lengths "
                  "int32 [runs + 1]; got q {}, k {}, cu_seqlens {} of {}",
                  n, shape_text(q.sizes()), shape_text(k.sizes()), shape_text(runs.cu_seqlens.sizes()),
                  c10::toString(runs.cu_seqlens.scalar_type()));
  // Flash attention's varlen layout: [S, H, D] (token-major), cumulative sequence starts int32 [N + 1]
  // on the device: the batch's copy, made once a micro-batch (a host one is copied here, a test's).
  const torch::Tensor cu_seqlens =
      runs.cu_seqlens.device() == q.device() ? runs.cu_seqlens : runs.cu_seqlens.to(q.device(), /*non_blocking=*/true);
  const auto token_major = [](const torch::Tensor& x) { return x.squeeze(0).transpose(0, 1).contiguous(); };
  const auto outputs = at::_flash_attention_forward(token_major(q), token_major(k), token_major(v), cu_seqlens,
                                                    cu_seqlens, runs.max_length, runs.max_length, /*dropout_p=*/0.0,
                                                    /*is_causal=*/true, /*return_debug_mask=*/false);
  return std::get<0>(outputs).transpose(0, 1).unsqueeze(0);  // [S, H, D] -> [1, H, S, D]
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const PackedRuns* runs) {
  if (runs != nullptr) {
    std::int64_t total = 0;
    for (const std::int64_t n : runs->lengths) total += n;
    MGBENCH_REQUIRE(total == q.size(2), std::invalid_argument,
                    "causal_attention: lengths sum to {}, q {} holds {} positions", total, shape_text(q.sizes()),
                    q.size(2));
  }
  const bool packed = runs != nullptr && runs->lengths.size() > 1;
  if (q.device().is_cpu()) {
    return CpuCausalAttention::apply(q, k, v, packed ? runs->lengths : std::vector<std::int64_t>{q.size(2)});
  }
  if (packed && flash_varlen_applies(q, k, v)) return flash_varlen_causal_attention(q, k, v, *runs);
  const bool gqa = q.size(1) != k.size(1);
  if (!packed) {
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/true,
                                            /*scale=*/std::nullopt, gqa);
  }
#if MGBENCH_HAVE_CUDA
  // One call per sequence on this batch's host lengths: a graph captured here would replay them on
  // every later batch.
  MGBENCH_REQUIRE(c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None,
                  std::runtime_error,
                  "causal_attention: packed sequences in {} on {} take one attention call per sequence, on the "
                  "host's lengths, which a CUDA graph cannot capture (flash attention takes them in one call: "
                  "bf16 / fp16 on its GPUs)",
                  c10::toString(q.scalar_type()), q.device().str());
#endif
  std::vector<torch::Tensor> parts;  // packed sequences, one call each
  std::int64_t start = 0;
  for (const std::int64_t n : runs->lengths) {
    parts.push_back(causal_attention(q.narrow(2, start, n), k.narrow(2, start, n), v.narrow(2, start, n)));
    start += n;
  }
  return torch::cat(parts, 2);
}

PackedRuns PackedRuns::of(std::vector<std::int64_t> lengths, bool pin_memory, std::int64_t bound) {
  MGBENCH_REQUIRE(!lengths.empty(), std::invalid_argument, "PackedRuns: no runs");
  const auto n = static_cast<std::int64_t>(lengths.size());
  torch::Tensor cu = torch::empty({n + 1}, torch::TensorOptions(torch::kInt32).pinned_memory(pin_memory));
  auto* ends = cu.data_ptr<std::int32_t>();
  ends[0] = 0;
  std::int64_t end = 0, longest = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t length = lengths[static_cast<std::size_t>(i)];
    MGBENCH_REQUIRE(length >= 0, std::invalid_argument, "PackedRuns: run {} has {} positions", i, length);
    end += length;
    MGBENCH_REQUIRE(end <= std::numeric_limits<std::int32_t>::max(), std::invalid_argument,
                    "PackedRuns: {} positions do not fit flash attention's int32 offsets", end);
    ends[i + 1] = static_cast<std::int32_t>(end);
    longest = std::max(longest, length);
  }
  MGBENCH_REQUIRE(bound == 0 || bound >= longest, std::invalid_argument,
                  "PackedRuns: a bound of {} positions below the longest run's {}", bound, longest);
  return {std::move(lengths), std::move(cu), bound > 0 ? bound : longest};
}

}  // namespace mgbench::models
