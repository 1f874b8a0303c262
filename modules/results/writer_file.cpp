// The results file a ResultsWriter opens: rank 0 takes the write lock and checks the path (room for
// the run, an mgbench results file or none yet), agreed by every rank; then every rank opens or
// creates it collectively through MPI-IO.
#include "results/writer.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/mpi_strings.h"
#include "results/write_lock.h"

namespace mgbench::results {
namespace {

using h5::check_status;

std::string mib(std::uint64_t bytes) { return fmt::format("{:.2f} MiB", static_cast<double>(bytes) / (1 << 20)); }

/// "" when the file system of path has room for `needed` more bytes, else the problem.
std::string check_free_space(const std::string& path, std::uint64_t needed) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  struct statvfs fs {};
  if (statvfs(dir.c_str(), &fs) != 0) return "";  // cannot tell: the writes will say
  const std::uint64_t free_bytes = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (free_bytes >= needed) return "";
  return fmt::format(
      "results file '{}': its file system has {} free, the run needs about {} (its tables are allocated when the "
      "run starts); free some space or choose another --results path. Nothing was written",
      path, mib(free_bytes), mib(needed));
}

}  // namespace

std::uint64_t run_bytes_upper_bound(std::span<const RankLayout> layouts, std::uint64_t attribute_bytes) {
  // Per object (group or dataset): its header, fill-value and layout messages, small attributes.
  constexpr std::uint64_t kObjectBytes = 4096;
  constexpr std::uint64_t kFileBytes = 64 * 1024;  // superblock, root group, heaps, the run's own datasets
  auto rows = [](std::int64_t n) { return static_cast<std::uint64_t>(std::max<std::int64_t>(n, 0)); };
  std::uint64_t bytes = kFileBytes + 2 * attribute_bytes + 4 * kObjectBytes + sizeof(RunSummary);
  for (const RankLayout& l : layouts) {
    const std::uint64_t steps = rows(l.epochs) * rows(l.steps_per_epoch);
    bytes += 3 * kObjectBytes + steps * sizeof(StepRecord) + rows(l.epochs) * sizeof(EpochRecord);
    if (l.indices_per_epoch > 0) bytes += kObjectBytes + rows(l.epochs) * rows(l.indices_per_epoch) * 8;
    if (l.cuda_metrics) {
      bytes += 3 * kObjectBytes + sizeof(CudaSummaryRecord) + kCudaApiRows * sizeof(CudaApiRecord) +
               kCudaKernelRows * sizeof(CudaKernelRecord);
    }
    if (!l.metrics.empty()) bytes += kObjectBytes + steps * l.metrics.size() * 8;
    if (l.comm_rows > 0) bytes += kObjectBytes + rows(l.comm_rows) * sizeof(CommRecord);
    if (l.telemetry) bytes += 2 * kObjectBytes + sizeof(EnergyRecord) + kTelemetryRows * sizeof(TelemetryRecord);
  }
  return bytes + bytes / 4;
}

void ResultsWriter::open_file(bool create, std::uint64_t needed_bytes) {
  // Rank 0 inspects the path so that every rank fails, or proceeds, together.
  std::string problem;
  bool exists = false;
  if (rank_ == 0) {
    problem = lock_for_writing(path_, lock_.fd, lock_.created);
    exists = access(path_.c_str(), F_OK) == 0;
    if (!problem.empty()) {
      // another job writes the file: touch nothing
    } else if (std::string full = check_free_space(path_, needed_bytes); !full.empty()) {
      problem = std::move(full);
    } else if (!exists && !create) {
      problem = fmt::format("results file '{}' of the run to resume does not exist (moved or deleted?)", path_);
    } else if (std::error_code ec; exists && std::filesystem::is_directory(path_, ec)) {
      problem = fmt::format("results file '{}' is a directory: expected the path of an HDF5 file (such as '{}')", path_,
                            (std::filesystem::path(path_) / "results.h5").string());
    } else if (exists && H5Fis_hdf5(path_.c_str()) <= 0) {
      problem = fmt::format(
          "results file '{}' exists and is not an HDF5 file; refusing to touch it "
          "(choose another --results path)",
          path_);
    } else if (exists && access(path_.c_str(), W_OK) != 0) {
      problem = fmt::format(
          "results file '{}' is not writable ({}): each run is appended to the file given; make it writable "
          "or choose another --results path",
          path_, std::strerror(errno));
    }
  }
  problem = broadcast_string(comm_, problem);
  // A start that fails before the file holds anything of this job's leaves no lock file it made (a
  // resume whose results file is gone, a path that is not a results file); released as this throws.
  const auto unlock_on_failure = [&] {
    std::error_code ec;
    if (lock_.created && (exists || !std::filesystem::exists(path_, ec))) remove_lock_file(path_);
  };
  if (!problem.empty()) {
    unlock_on_failure();
    throw ResultsError(problem);
  }
  exists = broadcast_string(comm_, exists ? "1" : "0") == "1";

  const std::string open_what = fmt::format("{} results file '{}'", exists ? "open" : "create", path_);
  h5::Handle fapl = h5::wrap_plist(H5Pcreate(H5P_FILE_ACCESS), open_what);
  check_status(H5Pset_fapl_mpio(fapl, comm_, MPI_INFO_NULL), open_what);
  check_status(H5Pset_all_coll_metadata_ops(fapl, true), open_what);
  check_status(H5Pset_coll_metadata_write(fapl, true), open_what);
  if (exists) {
    try {
      file_ = h5::wrap_file(H5Fopen(path_.c_str(), H5F_ACC_RDWR, fapl), open_what);
      if (!is_results_file(file_)) {
        throw ResultsError(
            fmt::format("'{}' is an HDF5 file but not an mgbench results file (no schema=\"{}\" "
                        "attribute or /runs group); choose another --results path",
                        path_, kSchemaName));
      }
    } catch (...) {
      unlock_on_failure();
      throw;
    }
  } else {
    created_ = true;  // from here on a failed creation removes the file (abandon_creation)
    try {
      file_ = h5::wrap_file(H5Fcreate(path_.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl), open_what);
    } catch (...) {
      unlock_on_failure();  // only where nothing was made
      throw;
    }
    h5::write_attributes(file_, {{"schema", std::string(kSchemaName)}, {"schema_version", kSchemaVersion}});
    h5::wrap_group(H5Gcreate2(file_, "runs", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "create /runs");
  }
}

void ResultsWriter::LockFile::close() noexcept {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace mgbench::results
