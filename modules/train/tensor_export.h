#pragma once
// The recipe's exports written at the end of a completed run (Recipe::tensor_exports: PEFT adapters,
// a Hugging Face checkpoint) without the model whole in one memory: under FSDP the units are
// gathered one at a time on every rank and rank 0 writes each exported tensor while its unit is
// whole, into a file laid out up front (models::SafetensorsWriter) -- the bytes write_safetensors
// would write from the whole model.
#include <vector>

#include "train/parallel/fsdp.h"
#include "train/recipe.h"

namespace mgbench::train {

/// Writes exports on the rank where `writes` (rank 0), each file as it would be from the whole
/// model; exports must be the same list on every rank (nothing to export: no collective). fsdp (a fully sharded run;
/// nullptr: every rank holds the whole model): its units gathered one at a time, a collective every rank calls, and
/// each tensor written while its unit is gathered. Throws DataError naming the file on I/O errors, std::logic_error for
/// a sharded run's exported tensor that belongs to no unit.
void write_tensor_exports(const std::vector<TensorExport>& exports, FullyShardedUnits* fsdp, bool writes);

}  // namespace mgbench::train
