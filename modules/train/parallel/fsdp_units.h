#pragma once
// What FullyShardedUnits (fsdp.h) keeps per unit and per collective, and the operations on it:
// gathering a unit's shards (all-gather through a flat buffer), freeing them again (reshard), and
// reduce-scattering its gradients after backward (one in flight). Internal to fsdp.cpp and
// fsdp_units.cpp.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/core/DeviceGuard.h>
#include <torch/torch.h>

#include "models/row_gradient.h"
#include "runtime/communicator.h"
#include "train/parallel/fsdp.h"
#include "train/parallel/shard_layout.h"

namespace mgbench::train {
namespace fsdp {

/// Memory of gathered parameters and of the collectives' flat buffers, on the CPU kept for the next
/// unit of the same size instead of freed: with glibc's malloc, the activations allocated between a
/// unit's frees and the next unit's allocations split the freed chunks, and every gather grew the
/// heap (33 MiB a layer of a 146M-parameter model, measured). On a GPU the CUDA caching allocator
/// does this already (FSDP2 relies on it), and blocks go back to it. Blocks of 32 MiB and more are
/// not kept: glibc serves them with mmap whatever its heap holds (DEFAULT_MMAP_THRESHOLD_MAX on
/// 64-bit hosts) and gives them back to the system when freed, so they never fragment the heap,
/// and a kept one would hold a whole embedding's or head's bytes until the next of its size.
class BlockCache {
 public:
  static constexpr std::size_t kMmapAlwaysBytes = std::size_t{32} << 20;

  explicit BlockCache(bool enabled) : enabled_(enabled) {}

  /// A block of nbytes: a cached one of that size, else a new one from allocator.
  at::DataPtr take(c10::Allocator* allocator, std::size_t nbytes) {
    if (enabled_) {
      auto it = free_.find(nbytes);
      if (it != free_.end() && !it->second.empty()) {
        at::DataPtr block = std::move(it->second.back());
        it->second.pop_back();
        return block;
      }
    }
    return allocator->allocate(nbytes);
  }
  /// Takes block back (kept when caching, freed otherwise).
  void give(std::size_t nbytes, at::DataPtr block) {
    if (enabled_ && block.get() != nullptr && nbytes < kMmapAlwaysBytes) free_[nbytes].push_back(std::move(block));
  }

  /// A flat tensor of numel elements in a block (uninitialised).
  torch::Tensor empty(std::int64_t numel, const torch::TensorOptions& options) {
    if (!enabled_) return torch::empty({numel}, options);
    const std::size_t nbytes = static_cast<std::size_t>(numel) * options.dtype().itemsize();
    c10::Allocator* allocator = c10::GetAllocator(options.device().type());
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, take(allocator, nbytes), allocator,
                         /*resizable=*/false);
    return torch::empty({0}, options).set_(storage, 0, {numel}, {1});
  }
  /// t's block back into the cache; t is undefined afterwards. Only once nothing reads or writes
  /// it any more (the collective that used it waited for: the communicator's own reference to it,
  /// which it may drop later, then holds an empty storage).
  void release(torch::Tensor& t) {
    if (enabled_ && t.defined()) {
      c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
      const std::size_t nbytes = storage->nbytes();
      give(nbytes, storage->set_data_ptr(at::DataPtr(nullptr, t.device())));
      storage->set_nbytes(0);
    }
    t = torch::Tensor();
  }

  /// Frees (nbytes 0) or re-allocates a tensor's whole storage in place, as FSDP2's
  /// storage().resize_(): the tensor, its views and autograd's saved references keep pointing at it.
  /// On the tensor's device (the caching allocator allocates on the thread's current one), as
  /// resize_bytes_cuda guards it.
  void resize_storage(const torch::Tensor& t, std::size_t nbytes) {
    const c10::OptionalDeviceGuard on(t.device());
    c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    const std::size_t old = storage->nbytes();
    if (old == nbytes) return;
    give(old, storage->set_data_ptr(take(storage->allocator(), nbytes)));
    storage->set_nbytes(nbytes);
  }

 private:
  bool enabled_;
  std::unordered_map<std::size_t, std::vector<at::DataPtr>> free_;
};

struct Param {
  torch::Tensor full;   // the module's parameter; storage freed while sharded
  torch::Tensor shard;  // [chunk_rows, ...]: this rank's rows, padded
  ShardLayout layout;
  std::int64_t offset = 0;  // in the unit's flat shard
  std::size_t full_nbytes = 0;
};

/// A part of a frozen packed weight (models::PackedWeight): sharded evenly, as bytes.
struct PackedPart {
  torch::Tensor full;       // the module's tensor; storage freed while sharded
  torch::Tensor shard;      // uint8 [full_nbytes / world]: this rank's bytes
  std::int64_t offset = 0;  // in the unit's packed shard
  std::size_t full_nbytes = 0;
};

enum class UnitState { kSharded, kGathering, kGathered };

struct Unit {
  std::string name;
  std::vector<Param> params;
  bool reshard_after_forward = true;
  bool backward_reads_parameters = true;  // models::ParameterUnit's
  int forward_uses = 1;                   // models::ParameterUnit's
  std::int64_t flat_numel = 0;            // sum of the shards' numel
  torch::TensorOptions options;
  bool trainable = false;  // some parameter requires grad
  /// One contiguous parameter whose rows divide evenly over the ranks, nothing packed: the
  /// rank-major flat buffer of its collectives is the parameter itself, so it is all-gathered
  /// straight into the parameter's storage and reduce-scattered straight from its gradient, with no
  /// second whole-size buffer (the embedding and the output head: most of a small Llama's bytes).
  bool in_place = false;
  UnitState state = UnitState::kSharded;
  std::unique_ptr<runtime::Work> gather;
  torch::Tensor gather_input, gather_output;
  std::vector<PackedPart> packed;  // frozen packed weights' parts, gathered as bytes beside the parameters
  std::int64_t packed_bytes = 0;   // this rank's packed shard bytes
  std::unique_ptr<runtime::Work> packed_gather;
  torch::Tensor packed_input, packed_output;
  /// Its gradient is reduce-scattered by RowGradientBlocks as its weight's backward hands the
  /// blocks to `sink` (UnitHooks::row_gradient_sink), not whole after backward (reduced_by_row_blocks).
  bool by_rows = false;
  bool by_rows_always = false;  // ... in every step (ParameterUnit::gradient_whole_at_times false)
  std::unique_ptr<models::RowGradientSink> sink;
  // Per micro-batch (reset by finish_backward):
  bool entered_with_grad = false;      // its post-backward is attached (or left to finish_backward)
  bool pre_backward_attached = false;  // it is regathered in backward
  bool post_backward_done = false;
  bool rows_reduced = false;        // this backward handed its gradient over by rows
  bool rows_added = false;          // ... onto an earlier micro-batch's gradient
  std::int64_t next_row_block = 0;  // the block it hands over next
};

/// A reduce-scatter in flight: its unit's trainable parameters and where their sums land.
struct PendingReduce {
  Unit* unit = nullptr;
  std::unique_ptr<runtime::Work> work;
  torch::Tensor input, output;
  double post_divide = 1;
  /// A block of rows (State::reduce_rows): the output is those rows of the shard's gradient, or,
  /// where add_to is defined (an earlier micro-batch's sum), is added to them.
  bool by_rows = false;
  torch::Tensor add_to;
};

}  // namespace fsdp

struct FullyShardedUnits::State {
  runtime::Communicator& comm;
  bool reshard_after_forward;
  std::vector<fsdp::Unit> units;
  std::unordered_map<const c10::TensorImpl*, torch::Tensor> shard_by_param;
  std::optional<fsdp::PendingReduce> reduce;
  fsdp::BlockCache cache;
  std::vector<std::unique_ptr<runtime::Work>> done_gathers, done_reduces;  // since take_collectives
  std::int64_t gathered_bytes = 0, reduced_bytes = 0;                      // since take_collectives

  int rank() const { return comm.rank(); }
  int world() const { return comm.world_size(); }

  void issue_gather(fsdp::Unit& u);
  void wait_gather(fsdp::Unit& u);
  void copy_out(fsdp::Unit& u);  // a gathered flat buffer into the unit's parameters
  void reshard(fsdp::Unit& u);
  void post_backward(fsdp::Unit& u);
  /// The unit's gradients as its reduce-scatter's flat rank-major input; the parameters' whole
  /// gradients are dropped.
  torch::Tensor reduce_scatter_input(fsdp::Unit& u);
  void finish_reduce();
  /// A reduce-scatter of unit u's `input` to fill in (its output) and launch: the input divided
  /// first where FSDP2 divides first, and the reduce-scatter in flight finished (one at a time).
  fsdp::PendingReduce begin_reduce(fsdp::Unit& u, torch::Tensor input);
  /// Issues r's reduce-scatter and keeps it in flight.
  void launch_reduce(fsdp::PendingReduce r);
  void prefetch_backward_before(int unit);
  /// Reduce-scatters block `block` (RowGradientBlocks) of unit u's gradient, [the block's rows of
  /// every rank, ...] rank-major, into those rows of its shard's gradient (one reduce-scatter in
  /// flight). Throws std::logic_error for blocks out of order or of the wrong size.
  void reduce_rows(fsdp::Unit& u, std::int64_t block, const torch::Tensor& gradient);
};

}  // namespace mgbench::train
