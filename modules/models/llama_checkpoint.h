#pragma once
// A Hugging Face LlamaForCausalLM checkpoint (safetensors, one file or sharded by
// model.safetensors.index.json) read part by part: what a rank of a sharded model reads is its
// rows of each dense tensor (dim 0, as FSDP shards it), never the whole model; NF4 projections are
// read whole, one tensor at a time, and quantised (the block scalers' double quantisation takes a
// mean over the whole tensor, torchao's NF4Tensor.double_quantize_scalers). Tensors are named as
// transformers names them (models/llama.h).
#include <cstdint>
#include <set>
#include <string>

#include <torch/torch.h>

#include "models/safetensors.h"

namespace mgbench::models {

/// A weight with NaN or Inf would evaluate to `eval loss: nan` and train nothing: refused at load.
/// Throws DataError "<where> holds N non-finite value(s), the first X at flat index I" for a float
/// t holding any (t: the elements from flat index `offset` of the whole tensor on, a rank's rows).
/// Checked in pieces of 4 Mi elements: isfinite's temporaries over a whole embedding were 2.5x its
/// bytes (~330 MB for a 1536 x 128,256 bf16 one), the peak of a sharded load.
void require_finite(const torch::Tensor& t, std::int64_t offset, const std::string& where);

class LlamaCheckpointReader {
 public:
  /// Opens the checkpoint directory; tied: the model ties its output head to the embedding, so a
  /// checkpoint's lm_head.weight (equal to the embedding) is accepted unread. Throws DataError as
  /// SafetensorsCheckpoint does.
  LlamaCheckpointReader(const std::string& dir, bool tied);

  /// Quantises every NF4 projection among part's modules (named under prefix, "model.layers.3";
  /// "" for the whole model) from its checkpoint tensor, read whole on the host and quantised on
  /// `device`. Throws DataError naming the tensor for a missing one, a shape other than the
  /// projection's, a non-finite value or a numel NF4 cannot take.
  void load_nf4(const std::string& prefix, torch::nn::Module& part, torch::Device device);
  /// Reads rows [first_row, first_row + rows.size(0)) of the dense tensor `name` into rows (any
  /// device and dtype: converted), after checking that the checkpoint's tensor has the model's
  /// shape `sizes`; rows {0, sizes[0]} is the whole tensor. Throws DataError naming the file and
  /// tensor for a missing tensor, a shape mismatch, or a non-finite value among the rows read (by
  /// its flat index in the whole tensor).
  void read_rows(const std::string& name, c10::IntArrayRef sizes, std::int64_t first_row, const torch::Tensor& rows);
  /// Throws DataError naming a tensor of the checkpoint that neither load_nf4 nor read_rows asked
  /// for (a checkpoint of another model); rotary inv_freq buffers are ignored.
  void finish() const;

 private:
  std::string dir_;
  SafetensorsCheckpoint checkpoint_;
  std::set<std::string> unused_;
};

}  // namespace mgbench::models
