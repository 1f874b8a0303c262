#pragma once
// A checkpoint written by one number of ranks, read by another (--resume at another world size,
// checkpointer.h): each rank's state is put together from the rank files of the checkpoint, the
// sharded tensors cut anew -- what torch.distributed.checkpoint (DCP) does for FSDP2's DTensors
// when the world size changes (torchtitan resumes so; TorchTune's recipes do not).
#include <string>
#include <vector>

#include "train/checkpoint/checkpoint_state.h"

namespace mgbench::train {

/// Rank `rank` of `world_size`'s state from the rank files of a checkpoint written by files.size()
/// ranks (files[r]: rank r's). A tensor stored with CheckpointState::put_shard (an FSDP parameter's
/// shard, its optimizer state) becomes this rank's shard at world_size -- FSDP2's dim-0 chunk,
/// padded (train/parallel/shard_layout.h) -- its rows copied from the old ranks whose chunks hold
/// them (each old shard read whole, CRC-checked, one at a time). Tensors stored whole and the
/// metadata are rank (rank mod files.size())'s: its RNG states and records; an entry absent there is
/// taken from the first rank file that has it.
/// Throws DataError naming the file for an unreadable rank file, one written by another rank than
/// its place, or a sharded tensor whose whole shape, dtype or shard shape differs between the files
/// or that a rank holding its rows lacks; std::invalid_argument for world_size < 1 or rank outside it.
CheckpointState reshard_checkpoint(const std::vector<std::string>& files, int rank, int world_size);

}  // namespace mgbench::train
