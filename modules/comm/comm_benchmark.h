#pragma once
// `mgbench comm`: the collectives mgbench's training uses, measured on their own over the same
// Communicator (MPI on CPUs, NCCL on GPUs), in nccl-tests' manner (src/common.cu): for each message
// size from --min-bytes to --max-bytes (times --step-factor), --warmup-iters launches, then --iters
// launches timed together on the host (completion included: a stream synchronise on the GPU), out of
// place and in place; then a correctness check per size against independently computed values
// (the `#wrong` column). Rank 0 prints the table (nccl-tests' layout: '#' metadata, header and units
// rows; time min / avg / max across ranks, algbw and busbw from the average); every rank writes its
// rows into the results file as a run of task `comm` (rank_<r>/comm, docs/results-schema.md), which
// `mgbench predict` reads.
#include <cstdint>
#include <string>
#include <vector>

#include "axes/precision.h"
#include "comm/collectives.h"
#include "core/option_table.h"
#include "runtime/backend.h"
#include "runtime/communicator.h"
#include "runtime/device.h"
#include "runtime/mpi_env.h"

namespace mgbench::comm {

/// sum | max | min.
std::span<const options::Choice<runtime::ReduceOp>> reduce_op_choices();

/// "8", "4K", "64M", "1G" (powers of 1024, as nccl-tests' -b / -e) -> bytes. Throws ConfigError
/// naming the option for anything else, or for less than one byte.
std::int64_t parse_bytes(std::string_view option, const std::string& text);

/// The message sizes of a sweep: min, min x factor, ... while <= max (nccl-tests' -b -e -f).
std::vector<std::int64_t> sweep_sizes(std::int64_t min_bytes, std::int64_t max_bytes, std::int64_t factor);

struct CommOptions {
  /// --help's text above the options.
  static constexpr const char* kUsage =
      "mgbench comm: collective benchmark over the Communicator mgbench trains with (MPI on CPUs, NCCL on GPUs), in "
      "nccl-tests' manner and output.\nusage: mpirun -np N mgbench comm [--collective all-reduce,...] [--min-bytes 8] "
      "[--max-bytes 64M] [options]\noptions";

  std::vector<std::string> collectives{"all-reduce"};  // names of collective_choices(), or "all"
  runtime::DeviceRequest device = runtime::DeviceRequest::kAuto;
  runtime::Backend backend = runtime::Backend::kAuto;
  axes::Dtype dtype = axes::Dtype::kFloat32;  // the dtype table: axes/precision.h
  runtime::ReduceOp op = runtime::ReduceOp::kSum;
  int root = 0;
  std::string min_bytes = "8";
  std::string max_bytes = "64M";
  std::int64_t step_factor = 2;
  std::int64_t warmup_iters = 5;
  std::int64_t iters = 20;
  bool check = true;
  double comm_timeout_s = 600;
  std::string results = "outputs/results.h5";
  std::string run_name;
  int perturb_rank = -1;  // testing: this rank's input gets one wrong element before the check

  /// Declares every option above into table.
  void declare(options::OptionTable& table);
  /// Parses the sizes and collectives and checks the rules between options, and that --backend is one
  /// `mgbench comm` measures (its row's in_comm). Throws ConfigError.
  void validate();

  // Resolved by validate().
  std::vector<Collective> resolved_collectives;
  std::vector<std::int64_t> sizes;
};

/// Runs the benchmark on this rank (options validated; table: the options, for the run attributes).
/// Returns the exit code: 0 done, 1 a set-up failure or wrong values found by the check, 2 a
/// --root outside the world. A rank failing during the measurement aborts the job.
int run_comm_benchmark(const CommOptions& options, const options::OptionTable& table, runtime::MpiEnvironment& env,
                       const std::string& command_line);

}  // namespace mgbench::comm
