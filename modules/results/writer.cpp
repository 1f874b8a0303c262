// The ResultsWriter's run from creation to close: each rank's layout and attributes gathered, the
// run's groups and tables created collectively (every stage agreed by every rank), the abort recorder
// armed, and finish(), mark_failed() or a failing job's destructor. Opening the file: writer_file.cpp;
// resuming a run: writer_resume.cpp; the rows written while it runs: writer_rows.cpp.
#include "results/writer.h"

#include <array>
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

}  // namespace

std::string sanitize_run_name(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  return out;
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
  constexpr int kLayoutFields = 7;
  std::array<std::int64_t, kLayoutFields> mine{layout.epochs,
                                               layout.steps_per_epoch,
                                               layout.indices_per_epoch,
                                               layout.cuda_metrics ? 1 : 0,
                                               static_cast<std::int64_t>(layout.metrics.size()),
                                               layout.comm_rows,
                                               layout.telemetry ? 1 : 0};
  std::vector<std::int64_t> fields(kLayoutFields * static_cast<std::size_t>(world_size_));
  MGBENCH_CHECK_MPI(
      MPI_Allgather(mine.data(), kLayoutFields, MPI_INT64_T, fields.data(), kLayoutFields, MPI_INT64_T, comm_));
  std::vector<RankLayout> layouts(static_cast<std::size_t>(world_size_));
  for (std::size_t r = 0; r < layouts.size(); ++r) {
    const auto* l = &fields[kLayoutFields * r];
    layouts[r] = {l[0], l[1],     l[2], l[3] != 0, std::vector<std::string>(static_cast<std::size_t>(l[4])),
                  l[5], l[6] != 0};
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
    h5::Handle energy, telemetry;
    if (l.telemetry) {
      const hsize_t one[1] = {1};
      const hsize_t reading_rows[1] = {static_cast<hsize_t>(kTelemetryRows)};
      const EnergyRecord empty_energy;
      const TelemetryRecord empty_reading;
      energy = create_table(group, "energy", energy_record_type(), one, &empty_energy, group_path);
      telemetry = create_table(group, "telemetry", telemetry_record_type(), reading_rows, &empty_reading, group_path);
    }
    if (r == rank_) {
      own_ = {std::move(steps),    std::move(epochs),       std::move(indices), std::move(cuda_summary),
              std::move(cuda_api), std::move(cuda_kernels), std::move(metrics), std::move(comm_rows),
              std::move(energy),   std::move(telemetry)};
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
  for (h5::Handle* h : {&own_.telemetry, &own_.energy, &own_.comm, &own_.metrics, &own_.cuda_kernels, &own_.cuda_api,
                        &own_.cuda_summary, &own_.indices, &own_.epochs, &own_.steps, &summary_, &error_, &status_,
                        &run_group_, &file_}) {
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
  if (lock_.created) remove_lock_file(path_);  // released by lock_.close(), after
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
    mark_aborted(message);
  });
}

ResultsWriter::~ResultsWriter() {
  if (!finished_) watchdog::set_abort_recorder({});
  unregister();
  if (!finished_ && world_size_ > 1) {
    // Closing a parallel file is collective; an unfinished writer belongs to a failing job whose
    // other ranks may be gone, so release the handles instead of waiting on them. Everything
    // written so far is already in the file (raw data goes straight to MPI-IO).
    for (h5::Handle* h : {&own_.telemetry, &own_.energy, &own_.comm, &own_.metrics, &own_.cuda_kernels, &own_.cuda_api,
                          &own_.cuda_summary, &own_.indices, &own_.epochs, &own_.steps, &summary_, &error_, &status_,
                          &run_group_, &file_}) {
      h->release();
    }
  }
  if (comm_ != MPI_COMM_NULL && finished_) MPI_Comm_free(&comm_);
}

void ResultsWriter::finish(std::string_view status, const std::string& error) {
  in_collective_ = true;
  const watchdog::Deadline deadline(fmt::format("closing results file '{}'", path_));
  if (rank_ == 0) write_status(status, error);
  check_status(H5Fflush(file_, H5F_SCOPE_GLOBAL), fmt::format("flush '{}'", path_));
  for (h5::Handle* h :
       {&own_.telemetry, &own_.energy, &own_.comm, &own_.metrics, &own_.cuda_kernels, &own_.cuda_api,
        &own_.cuda_summary, &own_.indices, &own_.epochs, &own_.steps, &summary_, &error_, &status_, &run_group_}) {
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

void ResultsWriter::mark_failed(const std::string& message) noexcept { mark(kStatusFailed, message); }

void ResultsWriter::mark_aborted(const std::string& message) noexcept { mark(kStatusAborted, message); }

void ResultsWriter::mark(std::string_view status, const std::string& message) noexcept {
  if (finished_ || !status_.valid()) return;
  try {
    write_status(status, fmt::format("rank {}: {}", rank_, message));
  } catch (...) {
    // Nothing more can be done: the job is going down and the status stays "running".
  }
}

}  // namespace mgbench::results
