#pragma once
// What the host holds while a model is built or loaded: a probe of c10's CPU allocations, and the
// 8-layer Llama the memory tests build (units small beside the model, so that holding one unit and
// holding the model differ by 8x).
#include <algorithm>
#include <cstdint>

#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/torch.h>

#include "models/llama_config.h"

namespace mgbench::test {

/// The bytes of CPU tensors this thread allocates while the probe is installed (c10::DebugInfoGuard
/// with PROFILER_STATE): the running total and its peak, as c10's CPU allocator reports each
/// allocation and free to the profiler's MemoryReportingInfoBase (what torch.profiler's
/// profile_memory reads).
class HostTensorBytes final : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void*, std::int64_t alloc_size, std::size_t, std::size_t, c10::Device device) override {
    if (!device.is_cpu()) return;
    current += alloc_size;
    peak = std::max(peak, current);
  }
  bool memoryProfilingEnabled() const override { return true; }
  std::int64_t current = 0;
  std::int64_t peak = 0;
};

/// An untied Llama of 8 decoder layers, hidden 256, vocabulary 2048 (fp32: 1 MiB a layer's
/// attention, 3 MiB its MLP, 2 MiB the embedding and the head each).
inline models::LlamaConfig eight_layer_llama() {
  models::LlamaConfig c = models::LlamaConfig::preset("tiny");
  c.vocab_size = 2048;
  c.hidden_size = 256;
  c.intermediate_size = 1024;
  c.num_hidden_layers = 8;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.tie_word_embeddings = false;
  return c;
}

}  // namespace mgbench::test
