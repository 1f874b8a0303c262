#pragma once
// The cells and '#' notes of a run that several of the report's tables show alike (the image, LLM,
// DPO and comm tables): one definition, so the tables cannot drift apart. Internal to report/.
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "results/reader.h"

namespace mgbench::report {

/// A fraction as a percentage with 2 decimals ("93.50" for 0.935); "-" without one.
std::string percent(const std::optional<double>& v);

/// Rank 0's peak memory in MiB (GPU: the caching allocator's peak; CPU: peak resident set); NaN unrecorded.
double peak_memory_mib(const results::RunRecord& r);

/// ATen operators rank 0 dispatched per optimizer step and decoder layer (the summary's ops_per_step
/// over the LLM attribute decoder_layers: the host's work a layer costs, issue 47); NaN where not
/// counted (a run of one step, files before schema 10) or without decoder layers (image runs).
double ops_per_layer_step(const results::RunRecord& r);

/// A model path cut to its last 13 characters for a 16-character column.
std::string short_model(const results::RunRecord& r);

/// "<batch>x<grad-accum>".
std::string batch_x_accum(const results::RunRecord& r);

/// How often a run was resumed from a checkpoint (`mgbench ... --resume`); 0 when never.
std::int64_t resumes(const results::RunRecord& r);

/// --warmup-steps-excluded of a run (0 where not recorded): its rates (img/s, tokens/s, s/it) leave
/// those steps out, so two runs' rates compare only where it is the same.
std::int64_t warmup_steps_excluded(const results::RunRecord& r);

/// '#' lines under a table: why a run failed, which runs were preempted or resumed.
void print_notes(std::ostream& out, const results::RunRecord& r);

}  // namespace mgbench::report
