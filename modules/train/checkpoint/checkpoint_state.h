#pragma once
// One rank's checkpoint state (what checkpointer.h writes per rank and reads back): named tensors
// and string metadata in a safetensors file (github huggingface/safetensors, readable with its
// Python package), and the helpers that put a model, an optimizer and the RNGs into it and take
// them out again.
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace mgbench::models {
class SafetensorsFile;
}

namespace mgbench::train {

/// One rank's state: named tensors plus string metadata. Writers put, readers get; a missing
/// entry on reading is a DataError naming the file and the entry.
class CheckpointState {
 public:
  CheckpointState();
  /// A state read from file: its header now, each tensor read (pread) when asked for.
  explicit CheckpointState(const std::string& path);
  ~CheckpointState();
  CheckpointState(CheckpointState&&) noexcept;
  CheckpointState& operator=(CheckpointState&&) noexcept;

  void put(const std::string& name, const torch::Tensor& tensor);
  /// A rank's shard of a tensor of whole shape `whole`, sharded on dim 0 as FSDP2 does
  /// (train/parallel/shard_layout.h's ShardLayout at the writing world size, padding rows
  /// included): stored with its whole shape, so that another world size can cut it anew
  /// (reshard.h). Throws std::invalid_argument when the shard's shape is not that layout's.
  void put_shard(const std::string& name, const torch::Tensor& shard, at::IntArrayRef whole, int world_size);
  void put(const std::string& key, std::int64_t value);
  void put(const std::string& key, double value);
  void put_text(const std::string& key, const std::string& value);
  /// Trivially copyable records (results rows) as bytes; restored only by the same build.
  template <typename T>
  void put_records(const std::string& name, std::span<const T> records) {
    static_assert(std::is_trivially_copyable_v<T>);
    put_bytes(name, records.data(), records.size_bytes(), sizeof(T));
  }

  bool contains(const std::string& name) const;
  /// The tensors' names (in file order when read).
  std::vector<std::string> names() const;
  /// The whole shape of a tensor put with put_shard; nullopt for one stored whole. Throws
  /// DataError naming the file for a malformed entry.
  std::optional<std::vector<std::int64_t>> whole_shape(const std::string& name) const;
  /// The string metadata, CRC-32s and shapes included.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// A stored tensor; read from a file, it is checked against its CRC-32 (DataError naming the file
  /// and the tensor on a mismatch: a damaged checkpoint fails here, not later as a diverging run).
  torch::Tensor tensor(const std::string& name) const;
  std::int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  std::string text(const std::string& key) const;
  template <typename T>
  std::vector<T> records(const std::string& name) const {
    static_assert(std::is_trivially_copyable_v<T>);
    const torch::Tensor bytes = record_bytes(name, sizeof(T));
    std::vector<T> out(static_cast<std::size_t>(bytes.numel()) / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), bytes.data_ptr(), bytes.numel());
    return out;
  }

  /// Writes the state to path atomically (safetensors, fsynced), with each tensor's CRC-32 in the
  /// metadata ("crc32:<name>") and, given one, the writing rank ("rank"). Throws DataError naming the
  /// file.
  void write(const std::string& path, std::optional<int> rank = std::nullopt) const;
  /// Read back: throws DataError naming the file when it was written by another rank (the rank
  /// files of a checkpoint swapped or copied), before any tensor is used.
  void check_rank(int rank) const;
  /// The file read from ("" for a state being written): what error messages name.
  const std::string& source() const { return source_; }
  /// Names a state put together from several files (reshard.h) for its messages.
  void set_source(std::string source) { source_ = std::move(source); }

 private:
  void put_bytes(const std::string& name, const void* data, std::size_t bytes, std::size_t record_size);
  torch::Tensor record_bytes(const std::string& name, std::size_t record_size) const;
  const std::string& meta(const std::string& key) const;

  std::string source_;  // file read from ("" for a state being written)
  std::vector<std::pair<std::string, torch::Tensor>> tensors_;
  std::map<std::string, std::string> metadata_;
  std::unique_ptr<models::SafetensorsFile> file_;
};

/// A parameter as a checkpoint names it: its tensor on this rank (the whole parameter, or its shard)
/// and, for a shard, the whole parameter's shape.
struct CheckpointTensor {
  std::string name;
  torch::Tensor local;
  std::vector<std::int64_t> whole;  // empty: `local` is the whole tensor
};

/// The module's parameters and buffers, whole, by name.
std::vector<CheckpointTensor> module_tensors(torch::nn::Module& module);
/// Parameters and buffers of module as "<prefix><name>" (copied to the CPU).
void put_module(CheckpointState& state, const std::string& prefix, torch::nn::Module& module);
/// Copies them back in place (device and dtype of the module kept). Throws DataError naming the
/// file for a missing tensor or a shape mismatch.
void load_module(const CheckpointState& state, const std::string& prefix, torch::nn::Module& module);
/// The parameters (and buffers) as "<prefix><name>", shards with put_shard at world_size ranks.
void put_tensors(CheckpointState& state, const std::string& prefix, const std::vector<CheckpointTensor>& tensors,
                 int world_size);
/// Copies them back into each `local` in place (its device and dtype kept). Throws DataError naming
/// the file and the tensor for a missing tensor or another shape or dtype.
void load_tensors(const CheckpointState& state, const std::string& prefix,
                  const std::vector<CheckpointTensor>& tensors);
/// The optimizer's state of each of `params` (those the optimizer holds state for), as tensors
/// "<prefix><name>/<key>" laid out as the parameter (a shard's state sharded with it) and the step
/// count as metadata "<prefix><name>/step": AdamW's (torch::optim::AdamWParamState: exp_avg,
/// exp_avg_sq, max_exp_avg_sq with amsgrad) and SGD's momentum_buffer. Named, not in
/// torch::optim's archive (which numbers parameters by position), so that another world size can
/// reshard it. The hyper-parameters are the options' (the identity's), not stored. Throws
/// std::logic_error for an optimizer of another kind.
void put_optimizer(CheckpointState& state, const std::string& prefix, torch::optim::Optimizer& optimizer,
                   const std::vector<CheckpointTensor>& params, int world_size);
/// Sets the optimizer's state of each of `params` from the checkpoint (on the parameter's device);
/// a parameter without stored state gets none. Throws DataError naming the file and the tensor for
/// a shape that is not the parameter's.
void load_optimizer(const CheckpointState& state, const std::string& prefix, torch::optim::Optimizer& optimizer,
                    const std::vector<CheckpointTensor>& params);
/// The default CPU generator's state and, for a CUDA device, that device's generator.
void put_rng(CheckpointState& state, const torch::Device& device);
void load_rng(const CheckpointState& state, const torch::Device& device);

}  // namespace mgbench::train
