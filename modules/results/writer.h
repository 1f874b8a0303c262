#pragma once
// ResultsWriter: every rank of a job writes into one shared HDF5 file (parallel HDF5, MPI-IO).
//
// One writer job per file: rank 0 holds an exclusive POSIX lock on "<file>.lock" while the job has
// the file open (HDF5 files cannot take two writing processes: each caches metadata and would
// overwrite the other's). A second job on the same file fails at once with a message naming the
// lock holder; jobs one after another append runs to one file as before. The lock goes with the
// process (also on SIGKILL). Parallel file systems need POSIX locks enabled (Lustre: -o flock).
//
// Crash safety: all structure of a run (groups, attributes, fixed-size datasets with their
// space allocated) is created collectively when the run starts and flushed at once. From then on
// ranks only overwrite raw data in place, which never touches HDF5 metadata, so a SIGKILL at any
// later moment leaves the file, earlier runs included, readable. A rank that fails writes
// "failed" (its own error) or "aborted" (a watchdog expiry: a peer lost) and its message into the
// run's raw `status` / `error` datasets on its own, without any collective, before the job is
// aborted.
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "results/hdf5.h"
#include "results/schema.h"

namespace mgbench::results {

/// Sizes of this rank's tables, known before the run starts.
struct RankLayout {
  std::int64_t epochs = 0;
  std::int64_t steps_per_epoch = 0;    // rows of rank_<r>/steps per epoch
  std::int64_t indices_per_epoch = 0;  // columns of rank_<r>/indices; 0: no indices recorded
  bool cuda_metrics = false;           // rank_<r>/cuda_summary, cuda_api, cuda_kernels (GPU runs)
  std::vector<std::string> metrics;    // columns of rank_<r>/metrics (a recipe's per-step metrics); none: no table
  std::int64_t comm_rows = 0;          // rows of rank_<r>/comm (`mgbench comm`); 0: no table
  bool telemetry = false;              // rank_<r>/energy and telemetry (--telemetry other than off)
};

class ResultsWriter {
 public:
  /// Collective over comm. Opens path (creating it, or appending to an mgbench results file),
  /// creates /runs/<run_id> with run_attributes, and rank_<r> groups with each rank's
  /// rank_attributes and tables. Rank 0's run_attributes are stored (e.g. its start time).
  /// Throws ResultsError (same message on every rank) when path exists and is not an mgbench
  /// results file, or cannot be opened or written, or its file system has less free space than
  /// the run needs (run_bytes_upper_bound; the message names the file and both sizes). A failed
  /// creation leaves no file behind where there was none, and earlier runs of an existing file
  /// untouched; a rank stuck in a collective HDF5 call ends the job after the watchdog's default
  /// timeout (core/watchdog.h).
  ResultsWriter(const std::string& path, MPI_Comm comm, const std::string& run_name,
                const h5::Attributes& run_attributes, const h5::Attributes& rank_attributes, const RankLayout& layout);
  /// Collective over comm. Continues run `run_id` of the existing results file path (a resumed,
  /// preempted run): reopens its tables, checks that they match this job (same world size and
  /// layout), sets the status back to "running" and counts the resume in the run's `resumes`
  /// attribute (`resumed_utc`: when). Rows already written stay; later writes overwrite in place.
  /// Throws ResultsError (same message on every rank) when the file or run is missing or differs.
  ResultsWriter(const std::string& path, MPI_Comm comm, const std::string& run_id, const RankLayout& layout);
  ~ResultsWriter();
  ResultsWriter(const ResultsWriter&) = delete;
  ResultsWriter& operator=(const ResultsWriter&) = delete;

  const std::string& run_id() const { return run_id_; }
  const std::string& path() const { return path_; }

  /// Writes this rank's step rows of one epoch (0-based), at most steps_per_epoch of them. Independent.
  void write_steps(std::int64_t epoch, std::span<const StepRecord> steps);
  /// Writes this rank's row of rank_<r>/epochs. Independent.
  void write_epoch(const EpochRecord& record);
  /// Writes this rank's per-step metrics of one epoch (0-based): rows of layout.metrics.size()
  /// values, row-major, at most steps_per_epoch rows. Independent.
  void write_metrics(std::int64_t epoch, std::span<const double> rows);
  /// Writes this rank's computed sample indices of one epoch: indices_per_epoch of them, or fewer,
  /// the row then filled with -1 (not computed in this run: a stopped epoch's rest, or, in a run
  /// continuing another at a new world size, what that run computed first). Throws ResultsError for
  /// more than indices_per_epoch. Independent.
  void write_indices(std::int64_t epoch, std::span<const std::int64_t> indices);
  /// Writes this rank's CUDA metrics (layout.cuda_metrics): at most kCudaApiRows API rows and
  /// kCudaKernelRows kernel rows. Independent.
  void write_cuda_metrics(const CudaSummaryRecord& summary, std::span<const CudaApiRecord> api,
                          std::span<const CudaKernelRecord> kernels);
  /// Writes this rank's rows of rank_<r>/comm from row `first` on (layout.comm_rows in all). Independent.
  void write_comm(std::int64_t first, std::span<const CommRecord> rows);
  /// Writes this rank's energy row and its telemetry readings (layout.telemetry), at most
  /// kTelemetryRows of them. Independent.
  void write_telemetry(const EnergyRecord& energy, std::span<const TelemetryRecord> readings);
  /// Writes /runs/<id>/summary. Call on one rank (rank 0). Independent.
  void write_summary(const RunSummary& summary);

  /// Collective: records the final status ("completed", "preempted", or "failed" with `error`: a run
  /// that ended without a crash but whose results are wrong), flushes and closes.
  void finish(std::string_view status, const std::string& error = "");
  /// Any single rank, no collective, never throws: records "failed" and message in the run (this
  /// rank's own error: an exception). The caller then aborts the job; the file is left consistent.
  void mark_failed(const std::string& message) noexcept;
  /// As mark_failed, with "aborted": the job ended from outside this rank's computation. Once the
  /// run is open, a watchdog expiry (core/watchdog.h: a peer rank or node lost, hung or stopped)
  /// calls it with the census.
  void mark_aborted(const std::string& message) noexcept;

 private:
  /// Opens (or, when create is true and it does not exist, creates) path_ collectively, after
  /// rank 0 checked that its file system has needed_bytes free (agreed: every rank throws alike).
  void open_file(bool create, std::uint64_t needed_bytes);
  /// The collective HDF5 part of each constructor.
  void create_run(const std::string& run_name, const h5::Attributes& run_attributes,
                  const std::vector<std::string>& rank_attrs, const std::vector<RankLayout>& layouts,
                  const std::string& metric_columns);
  void reopen_run();
  /// mark_failed / mark_aborted.
  void mark(std::string_view status, const std::string& message) noexcept;
  /// Opens every rank's tables of the run (collectively), keeps this rank's and checks their
  /// sizes against layout_ (throws on a mismatch: run within agree_on).
  void open_own_tables();
  /// Runs a collective stage on every rank and agrees on its success (mgbench::agree) before any
  /// further collective: a failure on any rank closes what is open on every rank (abandon) and
  /// throws the lowest failing rank's message everywhere, instead of leaving the ranks in different
  /// HDF5 collectives (a full disk failing one rank's fill write inside H5Dcreate).
  void agree_on(const std::string& what, const std::function<void()>& stage);
  void abandon() noexcept;
  /// Removes path_ when this job created it (never a file with earlier runs). Any thread.
  void remove_created_file() noexcept;
  /// Lets the watchdog record an expiry in this run (mark_failed), from its own thread, and lists
  /// the file as written by this process (write_lock.h) until finish() or destruction.
  void arm_abort_recorder();
  void unregister() noexcept;
  void write_status(std::string_view status, const std::string& message);
  void write_rows(hid_t dataset, hid_t type, std::int64_t first_row, std::int64_t n_rows, const void* rows,
                  const char* what);

  std::string path_;
  std::string run_id_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int world_size_ = 1;
  RankLayout layout_;
  bool finished_ = false;
  std::atomic<bool> created_{false};        // this job created path_ (read by the watchdog's thread)
  bool registered_ = false;                 // register_writer'd
  std::atomic<bool> in_collective_{false};  // in finish(): a watchdog expiry must not write (its thread)
  /// Rank 0's open "<file>.lock", holding the write lock until closed. Declared before the HDF5
  /// handles, so that it is released after them, also when a constructor throws.
  struct LockFile {
    int fd = -1;
    bool created = false;  // this job made the lock file: a failed start removes it (remove_lock_file)
    void close() noexcept;
    ~LockFile() { close(); }
  };
  LockFile lock_;
  h5::Handle file_;
  h5::Handle run_group_;
  h5::Handle status_;
  h5::Handle error_;
  h5::Handle summary_;
  /// This rank's tables (rank_<r>/...); indices and cuda_* only when the layout has them.
  struct RankTables {
    h5::Handle steps, epochs, indices, cuda_summary, cuda_api, cuda_kernels, metrics, comm, energy, telemetry;
  };
  RankTables own_;
  h5::Handle step_type_;
  h5::Handle epoch_type_;
  h5::Handle summary_type_;
};

/// The bytes a run of these ranks' layouts takes in a results file, an upper bound: every table's
/// raw data (allocated when the run starts), a few KiB per object, twice attribute_bytes (the
/// attributes' text) and 25 % more. The writer refuses to start a run where less is free.
std::uint64_t run_bytes_upper_bound(std::span<const RankLayout> layouts, std::uint64_t attribute_bytes);

/// Makes a run-name safe as an HDF5 link name: keeps [A-Za-z0-9._-], maps the rest to '_'.
std::string sanitize_run_name(const std::string& name);

}  // namespace mgbench::results
