#pragma once
// `mgbench report`: one row per run in the style of the paper's Table 2 (Lawenda et al. 2025,
// arXiv 2503.15252): ranks, strategy, precision, pin_memory, image size, total time, test
// accuracy, efficiency vs 1 rank and vs FP64.
#include <cmath>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "results/reader.h"

namespace mgbench::report {

/// One table row, with the efficiencies resolved against the other runs.
struct Row {
  const results::RunRecord* run = nullptr;
  std::optional<double> efficiency_vs_1_rank;  // T(1 rank) / T(n ranks), as a fraction (1.0 = 100 %)
  std::optional<double> efficiency_vs_fp64;    // T(fp64) / T(this precision), same ranks
  std::string baseline_note;                   // why a multi-rank run has no efficiency vs 1 rank, or ""
};

/// Efficiency baselines: "vs 1 rank" pairs a run with a completed 1-rank run of the same
/// workload identity (report/workload.h: what is computed, device and GPU model), preferring the
/// same strategy; "vs FP64" with the completed fp64 run of the same identity but precision,
/// strategy and world size. Among several candidates (repeats) the median of their times is the
/// baseline (reference.h's median: the mean of the middle two of an even count). A multi-rank run
/// without a 1-rank run of its identity gets a note naming the nearest 1-rank run of its task
/// and where it differs.
std::vector<Row> build_rows(const std::vector<results::RunRecord>& runs);

/// The recipe of a run; runs written before recipes were recorded ran their job's only recipe then
/// ("lora" for LLM runs, "classification" for image runs).
std::string recipe_of(const results::RunRecord& run);

enum class Format { kTable, kCsv };

/// Writes the rows. The table, as nccl-tests prints its own: '#' metadata lines, a header and a
/// units row that start with '#', data rows that start with two spaces (`grep -v '^#'` leaves only
/// data), and '#' notes under it for failed, preempted and resumed runs. The CSV ends with
/// `resumes`.
void print(std::ostream& out, const std::vector<Row>& rows, Format format);

/// LLM fine-tuning runs (task llm / llm-eval), as the paper's Table 5 and Fig. 4: status, ranks,
/// model, dataset, precision, batch x grad-accum, s/it, tokens/s (all ranks), per-rank scaling
/// efficiency vs the 1-rank runs of the same workload and warm-up steps excluded ((tokens/s / ranks)
/// / the median tokens/s of those), MFU,
/// final (or eval) loss, the recipe, peak memory and weight bytes per parameter, and the notes of
/// print(); the CSV's columns in the same order (with file, task, batch_size and grad_accum apart,
/// and resumes), ending `resumes,recipe,peak_memory_mib,weight_bytes_per_param`.
/// Image runs are skipped.
void print_llm(std::ostream& out, const std::vector<results::RunRecord>& runs, Format format);

/// DPO runs (recipe dpo), as the second paper's DPO rows: ranks, model, dataset, precision, batch x
/// grad-accum, s/it, tokens/s (all ranks, real tokens), peak memory, final loss, and the reward
/// accuracy and margin at the end of the run (the recipe's per-step metrics: the mean over ranks of
/// the last min(10, steps) steps), with the notes and `resumes` column of print().
void print_dpo(std::ostream& out, const std::vector<results::RunRecord>& runs, Format format);

/// A run's gradient all-reduce, summed over its ranks and epochs [s]: its window (the first bucket's
/// start to the last's end) and the part of it exposed (the allreduce phase: not hidden behind
/// backward). The overlap is 1 - exposed / window.
struct AllReduceTimes {
  double window_s = 0;
  double exposed_s = 0;
};
AllReduceTimes all_reduce_times(const results::RunRecord& run);

/// True for runs of the DPO recipe.
bool is_dpo_run(const results::RunRecord& run);

/// A completed run with a finite total time: the runs efficiencies and predictions are built on.
bool is_completed(const results::RunRecord& run);

/// True for runs of `mgbench llm`.
bool is_llm_run(const results::RunRecord& run);

/// True for runs of `mgbench comm`.
bool is_comm_run(const results::RunRecord& run);

/// One size of one collective of a comm run, across its ranks.
struct CommRow {
  const results::CommRecord* first = nullptr;             // rank 0's record
  double min_s = INFINITY, avg_s = 0, max_s = -INFINITY;  // time of one launch across ranks [s]
  std::int64_t wrong = 0;                                 // wrong elements summed over ranks
  bool checked = true;                                    // every rank checked its output
  double algbw_gbs() const;                               // size / avg time [GB/s, 1e9]
  double busbw_gbs() const;  // algbw x the collective's bus factor (nccl-tests PERFORMANCE.md) [GB/s]
};

/// The rows of a comm run, in rank 0's order.
std::vector<CommRow> comm_rows(const results::RunRecord& run);

/// Runs of `mgbench comm`, in nccl-tests' columns: per run, collective, dtype, placement and size,
/// the time of one launch min / avg / max across ranks, algbw and busbw (from the average) and the
/// wrong elements summed over ranks. The CSV has one line per row.
void print_comm(std::ostream& out, const std::vector<results::RunRecord>& runs, Format format);

/// Where the training time of each run went: per phase (data, h2d, transform, forward, backward,
/// allreduce, optimizer) the seconds summed over the run's epochs, min / avg / max across ranks,
/// and the average share of the training time [%].
/// Also prints the all-reduce overlap: the share of the gradient all-reduce window (first
/// bucket start to last bucket end) hidden behind backward, 1 - exposed / window.
void print_phases(std::ostream& out, const std::vector<results::RunRecord>& runs);

/// CUDA metrics of GPU runs (CUPTI, rank_<r>/cuda_*), as the paper's Fig. 3, 5 and 6 read them
/// from Nsight Systems: per rank, HtoD / DtoH copies (count, bytes, bytes per sample, time,
/// % of the profile window), kernel and NCCL kernel time, the API calls (cudaLaunchKernel,
/// cudaStreamSynchronize, ...) with time and % of the window, rank 0's top kernels, and the peak
/// GPU memory. Runs without CUDA metrics are listed as such.
void print_cuda(std::ostream& out, const std::vector<results::RunRecord>& runs, std::size_t top_kernels = 10);

/// Energy of runs recorded with --telemetry (rank_<r>/energy, profile/telemetry.h): per run its
/// sources, span [s], energy [J] (each GPU once, each node's RAPL counter once: energy_j x node_share
/// summed over ranks), J/sample and J/token (over the samples and tokens the ranks computed in the
/// span), mean power [W] (energy / the longest span), the largest power [W] and temperature [C],
/// the mean SM clock [MHz] and the most throttled rank's share of its span [%]. A run with a rank
/// without a counter has no energy ("-") and says so; runs without telemetry are listed by name.
void print_energy(std::ostream& out, const std::vector<results::RunRecord>& runs, bool csv);

}  // namespace mgbench::report
