#include "results/writer.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>

#include "core/agreement.h"
#include "core/error.h"
#include "core/log.h"
#include "core/mpi_strings.h"
#include "core/timer.h"
#include "core/watchdog.h"
#include "results/write_lock.h"

namespace mgbench::results {
namespace {

using h5::check_status;

// Rank attributes travel between ranks as "kind name \x1f value \x1e" records.
std::string encode_attributes(const h5::Attributes& attributes) {
  std::string out;
  for (const auto& [name, value] : attributes) {
    const char kind = std::holds_alternative<std::string>(value)    ? 's'
                      : std::holds_alternative<std::int64_t>(value) ? 'i'
                                                                    : 'd';
    out += kind + name + '\x1f' + h5::exact_text(value) + '\x1e';
  }
  return out;
}

h5::Attributes decode_attributes(const std::string& encoded) {
  h5::Attributes out;
  std::size_t pos = 0;
  while (pos < encoded.size()) {
    const std::size_t sep = encoded.find('\x1f', pos);
    const std::size_t end = encoded.find('\x1e', sep);
    const char kind = encoded[pos];
    std::string name = encoded.substr(pos + 1, sep - pos - 1);
    std::string text = encoded.substr(sep + 1, end - sep - 1);
    if (kind == 'i') {
      out.emplace_back(std::move(name), static_cast<std::int64_t>(std::stoll(text)));
    } else if (kind == 'd') {
      out.emplace_back(std::move(name), std::stod(text));
    } else {
      out.emplace_back(std::move(name), std::move(text));
    }
    pos = end + 1;
  }
  return out;
}

/// A fixed-size, contiguous dataset whose space is allocated and filled at creation, so that
/// later writes touch only raw data.
h5::Handle create_table(hid_t group, const char* name, hid_t type, std::span<const hsize_t> dims, const void* fill,
                        const std::string& where) {
  const std::string what = fmt::format("create dataset {}/{}", where, name);
  h5::Handle space = h5::wrap_space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), what);
  h5::Handle dcpl = h5::wrap_plist(H5Pcreate(H5P_DATASET_CREATE), what);
  check_status(H5Pset_layout(dcpl, H5D_CONTIGUOUS), what);
  check_status(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY), what);
  check_status(H5Pset_fill_time(dcpl, H5D_FILL_TIME_ALLOC), what);
  if (fill != nullptr) check_status(H5Pset_fill_value(dcpl, type, fill), what);
  return h5::wrap_dataset(H5Dcreate2(group, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), what);
}

std::string hdf5_version() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  return fmt::format("{}.{}.{}", major, minor, release);
}

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
  }
  return bytes + bytes / 4;
}

std::string sanitize_run_name(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  return out;
}

void ResultsWriter::open_file(bool create, std::uint64_t needed_bytes) {
  // Rank 0 inspects the path so that every rank fails, or proceeds, together.
  std::string problem;
  bool exists = false;
  if (rank_ == 0) {
    problem = lock_for_writing(path_, lock_.fd);
    exists = access(path_.c_str(), F_OK) == 0;
    if (!problem.empty()) {
      // another job writes the file: touch nothing
    } else if (std::string full = check_free_space(path_, needed_bytes); !full.empty()) {
      problem = std::move(full);
    } else if (!exists && !create) {
      problem = fmt::format("results file '{}' of the run to resume does not exist (moved or deleted?)", path_);
    } else if (exists && H5Fis_hdf5(path_.c_str()) <= 0) {
      problem = fmt::format(
          "results file '{}' exists and is not an HDF5 file; refusing to touch it "
          "(choose another --results path)",
          path_);
    }
  }
  problem = broadcast_string(comm_, problem);
  if (!problem.empty()) throw ResultsError(problem);
  exists = broadcast_string(comm_, exists ? "1" : "0") == "1";

  const std::string open_what = fmt::format("{} results file '{}'", exists ? "open" : "create", path_);
  h5::Handle fapl = h5::wrap_plist(H5Pcreate(H5P_FILE_ACCESS), open_what);
  check_status(H5Pset_fapl_mpio(fapl, comm_, MPI_INFO_NULL), open_what);
  check_status(H5Pset_all_coll_metadata_ops(fapl, true), open_what);
  check_status(H5Pset_coll_metadata_write(fapl, true), open_what);
  if (exists) {
    file_ = h5::wrap_file(H5Fopen(path_.c_str(), H5F_ACC_RDWR, fapl), open_what);
    const h5::Attributes root = h5::read_attributes(file_);
    bool is_mgbench = false;
    for (const auto& [name, value] : root) {
      if (name == "schema" && std::holds_alternative<std::string>(value)) {
        is_mgbench = std::get<std::string>(value) == kSchemaName;
      }
    }
    if (!is_mgbench || !h5::link_exists(file_, "runs")) {
      throw ResultsError(
          fmt::format("'{}' is an HDF5 file but not an mgbench results file (no schema=\"{}\" "
                      "attribute or /runs group); choose another --results path",
                      path_, kSchemaName));
    }
  } else {
    created_ = true;  // from here on a failed creation removes the file (abandon_creation)
    file_ = h5::wrap_file(H5Fcreate(path_.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl), open_what);
    h5::write_attributes(file_, {{"schema", std::string(kSchemaName)}, {"schema_version", kSchemaVersion}});
    h5::wrap_group(H5Gcreate2(file_, "runs", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "create /runs");
  }
}

ResultsWriter::ResultsWriter(const std::string& path, MPI_Comm comm, const std::string& run_name,
                             const h5::Attributes& run_attributes, const h5::Attributes& rank_attributes,
                             const RankLayout& layout)
    : path_(path), layout_(layout) {
  h5::silence_error_stack();
  MGBENCH_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  MGBENCH_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  MGBENCH_CHECK_MPI(MPI_Comm_size(comm_, &world_size_));
  // A rank stuck in a collective HDF5 call (a peer failed inside it) ends the job after
  // --comm-timeout, removing the file if this job created it.
  const watchdog::Deadline deadline(fmt::format("creating a run in results file '{}'", path_), -1,
                                    [this] { remove_created_file(); });

  // Every rank creates every rank's group and tables (HDF5 metadata operations are collective),
  // so each rank needs all ranks' layouts and attributes: gathered before the file is touched.
  constexpr int kLayoutFields = 6;
  std::array<std::int64_t, kLayoutFields> mine{layout.epochs,
                                               layout.steps_per_epoch,
                                               layout.indices_per_epoch,
                                               layout.cuda_metrics ? 1 : 0,
                                               static_cast<std::int64_t>(layout.metrics.size()),
                                               layout.comm_rows};
  std::vector<std::int64_t> fields(kLayoutFields * static_cast<std::size_t>(world_size_));
  MGBENCH_CHECK_MPI(
      MPI_Allgather(mine.data(), kLayoutFields, MPI_INT64_T, fields.data(), kLayoutFields, MPI_INT64_T, comm_));
  std::vector<RankLayout> layouts(static_cast<std::size_t>(world_size_));
  for (std::size_t r = 0; r < layouts.size(); ++r) {
    const auto* l = &fields[kLayoutFields * r];
    layouts[r] = {l[0], l[1], l[2], l[3] != 0, std::vector<std::string>(static_cast<std::size_t>(l[4])), l[5]};
  }
  // The metrics' names, the same on every rank (one recipe): rank 0's, as an attribute of each table.
  std::string metric_columns;
  for (const auto& name : layout.metrics) metric_columns += (metric_columns.empty() ? "" : ",") + name;
  metric_columns = broadcast_string(comm_, metric_columns);
  const std::vector<std::string> rank_attrs = allgather_strings(comm_, encode_attributes(rank_attributes));
  const std::string run_attrs = broadcast_string(comm_, encode_attributes(run_attributes));
  std::uint64_t attribute_bytes = run_attrs.size() + metric_columns.size() * layouts.size();
  for (const auto& a : rank_attrs) attribute_bytes += a.size();

  open_file(/*create=*/true, run_bytes_upper_bound(layouts, attribute_bytes));
  agree_on(fmt::format("create a run in results file '{}'", path_),
           [&] { create_run(run_name, decode_attributes(run_attrs), rank_attrs, layouts, metric_columns); });
  arm_abort_recorder();
}

void ResultsWriter::create_run(const std::string& run_name, const h5::Attributes& run_attributes,
                               const std::vector<std::string>& rank_attrs, const std::vector<RankLayout>& layouts,
                               const std::string& metric_columns) {
  // Run id: rank 0's UTC start time and the run name, made unique in this file. Every rank runs
  // the loop: with collective metadata operations, H5Lexists is a collective call.
  const std::string base = broadcast_string(
      comm_, rank_ == 0 ? utc_now("%Y%m%dT%H%M%SZ") + (run_name.empty() ? "" : "_" + sanitize_run_name(run_name)) : "");
  run_id_ = base;
  for (int n = 2; h5::link_exists(file_, "runs/" + run_id_); ++n) run_id_ = fmt::format("{}-{}", base, n);
  const std::string run_path = "runs/" + run_id_;

  run_group_ = h5::wrap_group(H5Gcreate2(file_, run_path.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                              "create group /" + run_path);
  // Attribute writes are collective with identical values: everyone writes rank 0's.
  h5::write_attributes(run_group_, run_attributes);
  h5::write_attribute(run_group_, "hdf5_version", hdf5_version());
  h5::write_attribute(run_group_, "schema_version", kSchemaVersion);
  h5::write_attribute(run_group_, "run_id", run_id_);

  const hsize_t scalar_dims[1] = {1};
  h5::Handle status_type = h5::fixed_string_type(kStatusBytes);
  h5::Handle error_type = h5::fixed_string_type(kErrorBytes);
  status_ = create_table(run_group_, "status", status_type, {scalar_dims, 1}, nullptr, run_path);
  error_ = create_table(run_group_, "error", error_type, {scalar_dims, 1}, nullptr, run_path);
  summary_type_ = run_summary_type();
  const RunSummary empty_summary;
  summary_ = create_table(run_group_, "summary", summary_type_, {scalar_dims, 1}, &empty_summary, run_path);

  step_type_ = step_record_type();
  epoch_type_ = epoch_record_type();
  const StepRecord empty_step;
  const EpochRecord empty_epoch;
  const std::int64_t no_index = -1;
  for (int r = 0; r < world_size_; ++r) {
    const std::string group_path = fmt::format("{}/rank_{}", run_path, r);
    h5::Handle group = h5::wrap_group(H5Gcreate2(file_, group_path.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                                      "create group /" + group_path);
    h5::write_attributes(group, decode_attributes(rank_attrs[static_cast<std::size_t>(r)]));
    h5::write_attribute(group, "rank", static_cast<std::int64_t>(r));
    const RankLayout& l = layouts[static_cast<std::size_t>(r)];
    const hsize_t step_dims[1] = {static_cast<hsize_t>(l.epochs * l.steps_per_epoch)};
    const hsize_t epoch_dims[1] = {static_cast<hsize_t>(l.epochs)};
    h5::Handle steps = create_table(group, "steps", step_type_, step_dims, &empty_step, group_path);
    h5::Handle epochs = create_table(group, "epochs", epoch_type_, epoch_dims, &empty_epoch, group_path);
    h5::Handle indices;
    if (l.indices_per_epoch > 0) {
      const hsize_t index_dims[2] = {static_cast<hsize_t>(l.epochs), static_cast<hsize_t>(l.indices_per_epoch)};
      indices = create_table(group, "indices", H5T_STD_I64LE, index_dims, &no_index, group_path);
    }
    h5::Handle cuda_summary, cuda_api, cuda_kernels;
    if (l.cuda_metrics) {
      const hsize_t one[1] = {1};
      const hsize_t api_rows[1] = {static_cast<hsize_t>(kCudaApiRows)};
      const hsize_t kernel_rows[1] = {static_cast<hsize_t>(kCudaKernelRows)};
      const CudaSummaryRecord empty_cuda;
      const CudaApiRecord empty_api;
      const CudaKernelRecord empty_kernel;
      cuda_summary = create_table(group, "cuda_summary", cuda_summary_type(), one, &empty_cuda, group_path);
      cuda_api = create_table(group, "cuda_api", cuda_api_type(), api_rows, &empty_api, group_path);
      cuda_kernels = create_table(group, "cuda_kernels", cuda_kernel_type(), kernel_rows, &empty_kernel, group_path);
    }
    h5::Handle metrics;
    if (!l.metrics.empty()) {
      const hsize_t metric_dims[2] = {static_cast<hsize_t>(l.epochs * l.steps_per_epoch),
                                      static_cast<hsize_t>(l.metrics.size())};
      const double no_value = kNaN;
      metrics = create_table(group, "metrics", H5T_IEEE_F64LE, metric_dims, &no_value, group_path);
      h5::write_attribute(metrics, "columns", metric_columns);
    }
    h5::Handle comm_rows;
    if (l.comm_rows > 0) {
      const hsize_t comm_dims[1] = {static_cast<hsize_t>(l.comm_rows)};
      const CommRecord empty_comm;
      comm_rows = create_table(group, "comm", comm_record_type(), comm_dims, &empty_comm, group_path);
    }
    if (r == rank_) {
      own_ = {std::move(steps),    std::move(epochs),       std::move(indices), std::move(cuda_summary),
              std::move(cuda_api), std::move(cuda_kernels), std::move(metrics), std::move(comm_rows)};
    }
  }
  if (rank_ == 0) write_status(kStatusRunning, "");
  check_status(H5Fflush(file_, H5F_SCOPE_GLOBAL), fmt::format("flush '{}'", path_));
}

void ResultsWriter::agree_on(const std::string& what, const std::function<void()>& stage) {
  const Agreement a = agree(comm_, what, stage);
  if (a.ok()) return;
  abandon();
  throw ResultsError(world_size_ > 1 ? fmt::format("{} (on rank {})", a.error, a.failed_rank) : a.error);
}

void ResultsWriter::abandon() noexcept {
  // Every rank is here (agreed): the closes, collective, match. Their errors change nothing now.
  for (h5::Handle* h : {&own_.comm, &own_.metrics, &own_.cuda_kernels, &own_.cuda_api, &own_.cuda_summary,
                        &own_.indices, &own_.epochs, &own_.steps, &summary_, &error_, &status_, &run_group_, &file_}) {
    try {
      h->reset();
    } catch (...) {
    }
  }
  if (rank_ == 0) remove_created_file();
  lock_.close();
  finished_ = true;  // nothing left to close
}

void ResultsWriter::remove_created_file() noexcept {
  // A file this job created holds nothing but the failed run: leaving it would make later runs
  // refuse it (a 0-byte or half-made HDF5 file). A file that existed keeps its earlier runs.
  if (!created_) return;
  std::error_code ignored;
  if (std::filesystem::remove(path_, ignored)) log::warn("removed the half-made results file '{}'", path_);
}

ResultsWriter::ResultsWriter(const std::string& path, MPI_Comm comm, const std::string& run_id,
                             const RankLayout& layout)
    : path_(path), run_id_(run_id), layout_(layout) {
  h5::silence_error_stack();
  MGBENCH_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  MGBENCH_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  MGBENCH_CHECK_MPI(MPI_Comm_size(comm_, &world_size_));
  const watchdog::Deadline deadline(fmt::format("reopening run {} in results file '{}'", run_id_, path_));
  // A resumed run's tables exist: only its attributes grow.
  open_file(/*create=*/false, run_bytes_upper_bound({}, 0));
  agree_on(fmt::format("reopen run {} in results file '{}'", run_id_, path_), [&] { reopen_run(); });
  arm_abort_recorder();
}

void ResultsWriter::arm_abort_recorder() {
  register_writer(path_);
  registered_ = true;
  // The watchdog's thread calls it while this rank's main thread waits in a hung collective: never
  // while that collective is this file's own (HDF5 is not entered from two threads at once). Then
  // the run stays "running" in the file, and the readers show it aborted (its lock is free).
  watchdog::set_abort_recorder([this](const std::string& message) {
    if (in_collective_.load()) {
      log::error("rank {}: the hung stage is the results file's own: its run is left 'running'", rank_);
      return;
    }
    mark_failed(message);
  });
}

void ResultsWriter::reopen_run() {
  const std::string run_path = "runs/" + run_id_;
  if (!h5::link_exists(file_, run_path)) {
    throw ResultsError(fmt::format("results file '{}' has no run '{}' to resume", path_, run_id_));
  }
  run_group_ = h5::wrap_group(H5Gopen2(file_, run_path.c_str(), H5P_DEFAULT), "open group /" + run_path);
  std::int64_t stored_world = -1;
  std::int64_t resumes = 0;
  for (const auto& [name, value] : h5::read_attributes(run_group_)) {
    if (name == "world_size" && std::holds_alternative<std::int64_t>(value)) {
      stored_world = std::get<std::int64_t>(value);
    }
    if (name == "resumes" && std::holds_alternative<std::int64_t>(value)) resumes = std::get<std::int64_t>(value);
  }
  MGBENCH_REQUIRE(stored_world == world_size_, ResultsError,
                  "run '{}' in '{}' was started by {} rank(s); resume it with the same number, not {}", run_id_, path_,
                  stored_world, world_size_);
  status_ = h5::wrap_dataset(H5Dopen2(run_group_, "status", H5P_DEFAULT), "open /" + run_path + "/status");
  error_ = h5::wrap_dataset(H5Dopen2(run_group_, "error", H5P_DEFAULT), "open /" + run_path + "/error");
  summary_ = h5::wrap_dataset(H5Dopen2(run_group_, "summary", H5P_DEFAULT), "open /" + run_path + "/summary");
  summary_type_ = run_summary_type();
  step_type_ = step_record_type();
  epoch_type_ = epoch_record_type();
  open_own_tables();
  h5::write_attribute(run_group_, "resumes", resumes + 1);
  h5::write_attribute(run_group_, "resumed_utc", broadcast_string(comm_, rank_ == 0 ? utc_now_iso8601() : ""));
  if (rank_ == 0) write_status(kStatusRunning, "");
  check_status(H5Fflush(file_, H5F_SCOPE_GLOBAL), fmt::format("flush '{}'", path_));
}

void ResultsWriter::open_own_tables() {
  // With collective metadata operations every open is collective: every rank opens every rank's
  // tables in the same order and keeps its own.
  for (int r = 0; r < world_size_; ++r) {
    const std::string group_path = fmt::format("runs/{}/rank_{}", run_id_, r);
    auto open = [&](const char* name, bool required) {
      const std::string path = group_path + "/" + name;
      if (!required && !h5::link_exists(file_, path)) return h5::Handle();
      return h5::wrap_dataset(H5Dopen2(file_, path.c_str(), H5P_DEFAULT), "open /" + path);
    };
    h5::Handle steps = open("steps", true);
    h5::Handle epochs = open("epochs", true);
    h5::Handle indices = open("indices", false);
    h5::Handle cuda_summary = open("cuda_summary", false);
    h5::Handle cuda_api = open("cuda_api", false);
    h5::Handle cuda_kernels = open("cuda_kernels", false);
    h5::Handle metrics = open("metrics", false);
    h5::Handle comm_rows = open("comm", false);
    if (r == rank_) {
      own_ = {std::move(steps),    std::move(epochs),       std::move(indices), std::move(cuda_summary),
              std::move(cuda_api), std::move(cuda_kernels), std::move(metrics), std::move(comm_rows)};
    }
  }
  auto rows = [&](hid_t dataset) {
    h5::Handle space = h5::wrap_space(H5Dget_space(dataset), fmt::format("dataspace of rank {}'s table", rank_));
    hsize_t dims[2] = {0, 0};
    H5Sget_simple_extent_dims(space, dims, nullptr);
    return std::array<std::int64_t, 2>{static_cast<std::int64_t>(dims[0]), static_cast<std::int64_t>(dims[1])};
  };
  const bool same =
      rows(own_.steps)[0] == layout_.epochs * layout_.steps_per_epoch && rows(own_.epochs)[0] == layout_.epochs &&
      (layout_.indices_per_epoch == 0) == !own_.indices.valid() &&
      (!own_.indices.valid() || rows(own_.indices)[1] == layout_.indices_per_epoch) &&
      layout_.cuda_metrics == own_.cuda_summary.valid() && layout_.metrics.empty() == !own_.metrics.valid() &&
      (!own_.metrics.valid() || rows(own_.metrics)[1] == static_cast<std::int64_t>(layout_.metrics.size()));
  // Within agree_on: a mismatch on one rank fails every rank alike.
  MGBENCH_REQUIRE(same, ResultsError,
                  "run '{}' in '{}' has tables of another shape than this job's (epochs, steps per epoch, indices, "
                  "CUDA or recipe metrics differ): it is not the same configuration",
                  run_id_, path_);
}

void ResultsWriter::LockFile::close() noexcept {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

ResultsWriter::~ResultsWriter() {
  if (!finished_) watchdog::set_abort_recorder({});
  unregister();
  if (!finished_ && world_size_ > 1) {
    // Closing a parallel file is collective; an unfinished writer belongs to a failing job whose
    // other ranks may be gone, so release the handles instead of waiting on them. Everything
    // written so far is already in the file (raw data goes straight to MPI-IO).
    for (h5::Handle* h :
         {&own_.comm, &own_.metrics, &own_.cuda_kernels, &own_.cuda_api, &own_.cuda_summary, &own_.indices,
          &own_.epochs, &own_.steps, &summary_, &error_, &status_, &run_group_, &file_}) {
      h->release();
    }
  }
  if (comm_ != MPI_COMM_NULL && finished_) MPI_Comm_free(&comm_);
}

void ResultsWriter::write_rows(hid_t dataset, hid_t type, std::int64_t first_row, std::int64_t n_rows, const void* rows,
                               const char* what) {
  const std::string context = fmt::format("write {} of rank {} in '{}' run {}", what, rank_, path_, run_id_);
  h5::Handle file_space = h5::wrap_space(H5Dget_space(dataset), context);
  const int ndims = H5Sget_simple_extent_ndims(file_space);
  std::array<hsize_t, 2> dims{};
  H5Sget_simple_extent_dims(file_space, dims.data(), nullptr);
  const hsize_t row_size = ndims == 2 ? dims[1] : 1;
  MGBENCH_REQUIRE(first_row >= 0 && static_cast<hsize_t>(first_row + n_rows) <= dims[0], ResultsError,
                  "{}: rows [{}, {}) outside the table's {} rows", context, first_row, first_row + n_rows, dims[0]);
  const std::array<hsize_t, 2> start{static_cast<hsize_t>(first_row), 0};
  const std::array<hsize_t, 2> count{static_cast<hsize_t>(n_rows), row_size};
  check_status(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr), context);
  h5::Handle mem_space = h5::wrap_space(H5Screate_simple(ndims, count.data(), nullptr), context);
  check_status(H5Dwrite(dataset, type, mem_space, file_space, H5P_DEFAULT, rows), context);
}

void ResultsWriter::write_steps(std::int64_t epoch, std::span<const StepRecord> steps) {
  MGBENCH_REQUIRE(static_cast<std::int64_t>(steps.size()) <= layout_.steps_per_epoch, ResultsError,
                  "rank {} has {} steps in epoch {}, more than the {} the results layout reserved", rank_, steps.size(),
                  epoch, layout_.steps_per_epoch);
  if (steps.empty()) return;
  write_rows(own_.steps, step_type_, epoch * layout_.steps_per_epoch, static_cast<std::int64_t>(steps.size()),
             steps.data(), "steps");
}

void ResultsWriter::write_comm(std::int64_t first, std::span<const CommRecord> rows) {
  MGBENCH_REQUIRE(own_.comm.valid(), ResultsError, "write_comm: the run was created without a comm table");
  if (rows.empty()) return;
  write_rows(own_.comm, comm_record_type(), first, static_cast<std::int64_t>(rows.size()), rows.data(), "comm");
}

void ResultsWriter::write_epoch(const EpochRecord& record) {
  write_rows(own_.epochs, epoch_type_, record.epoch, 1, &record, "epochs");
}

void ResultsWriter::write_cuda_metrics(const CudaSummaryRecord& summary, std::span<const CudaApiRecord> api,
                                       std::span<const CudaKernelRecord> kernels) {
  MGBENCH_REQUIRE(own_.cuda_summary.valid(), ResultsError,
                  "write_cuda_metrics: the run was created without CUDA tables");
  MGBENCH_REQUIRE(static_cast<std::int64_t>(api.size()) <= kCudaApiRows &&
                      static_cast<std::int64_t>(kernels.size()) <= kCudaKernelRows,
                  ResultsError, "write_cuda_metrics: {} API rows / {} kernel rows exceed {} / {}", api.size(),
                  kernels.size(), kCudaApiRows, kCudaKernelRows);
  write_rows(own_.cuda_summary, cuda_summary_type(), 0, 1, &summary, "cuda_summary");
  if (!api.empty()) {
    write_rows(own_.cuda_api, cuda_api_type(), 0, static_cast<std::int64_t>(api.size()), api.data(), "cuda_api");
  }
  if (!kernels.empty()) {
    write_rows(own_.cuda_kernels, cuda_kernel_type(), 0, static_cast<std::int64_t>(kernels.size()), kernels.data(),
               "cuda_kernels");
  }
}

void ResultsWriter::write_metrics(std::int64_t epoch, std::span<const double> rows) {
  const auto columns = static_cast<std::int64_t>(layout_.metrics.size());
  MGBENCH_REQUIRE(own_.metrics.valid() && static_cast<std::int64_t>(rows.size()) % columns == 0 &&
                      static_cast<std::int64_t>(rows.size()) / columns <= layout_.steps_per_epoch,
                  ResultsError, "rank {}: {} metric values for epoch {}, the results layout reserved {} x {}", rank_,
                  rows.size(), epoch, layout_.steps_per_epoch, columns);
  if (rows.empty()) return;
  write_rows(own_.metrics, H5T_NATIVE_DOUBLE, epoch * layout_.steps_per_epoch,
             static_cast<std::int64_t>(rows.size()) / columns, rows.data(), "metrics");
}

void ResultsWriter::write_indices(std::int64_t epoch, std::span<const std::int64_t> indices) {
  MGBENCH_REQUIRE(own_.indices.valid() && static_cast<std::int64_t>(indices.size()) == layout_.indices_per_epoch,
                  ResultsError, "rank {}: {} indices for epoch {}, the results layout reserved {}", rank_,
                  indices.size(), epoch, layout_.indices_per_epoch);
  write_rows(own_.indices, H5T_NATIVE_INT64, epoch, 1, indices.data(), "indices");
}

void ResultsWriter::write_summary(const RunSummary& summary) {
  write_rows(summary_, summary_type_, 0, 1, &summary, "summary");
}

void ResultsWriter::write_status(std::string_view status, const std::string& message) {
  std::array<char, kStatusBytes> s{};
  std::memcpy(s.data(), status.data(), std::min(status.size(), s.size()));
  h5::Handle status_type = h5::fixed_string_type(kStatusBytes);
  write_rows(status_, status_type, 0, 1, s.data(), "status");
  if (message.empty()) return;  // keep a failure message already recorded
  std::array<char, kErrorBytes> e{};
  std::memcpy(e.data(), message.data(), std::min(message.size(), e.size()));
  h5::Handle error_type = h5::fixed_string_type(kErrorBytes);
  write_rows(error_, error_type, 0, 1, e.data(), "error");
}

void ResultsWriter::finish(std::string_view status, const std::string& error) {
  in_collective_ = true;
  const watchdog::Deadline deadline(fmt::format("closing results file '{}'", path_));
  if (rank_ == 0) write_status(status, error);
  check_status(H5Fflush(file_, H5F_SCOPE_GLOBAL), fmt::format("flush '{}'", path_));
  for (h5::Handle* h : {&own_.comm, &own_.metrics, &own_.cuda_kernels, &own_.cuda_api, &own_.cuda_summary,
                        &own_.indices, &own_.epochs, &own_.steps, &summary_, &error_, &status_, &run_group_}) {
    h->reset();
  }
  file_.reset();
  lock_.close();  // after the file is closed: the next job may open it
  finished_ = true;
  watchdog::set_abort_recorder({});
  unregister();
}

void ResultsWriter::unregister() noexcept {
  if (!registered_) return;
  unregister_writer(path_);
  registered_ = false;
}

void ResultsWriter::mark_failed(const std::string& message) noexcept {
  if (finished_ || !status_.valid()) return;
  try {
    write_status(kStatusFailed, fmt::format("rank {}: {}", rank_, message));
  } catch (...) {
    // Nothing more can be done: the job is going down and the status stays "running".
  }
}

}  // namespace mgbench::results
