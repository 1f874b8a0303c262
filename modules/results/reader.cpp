#include "results/reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "core/input_file.h"
#include "results/write_lock.h"

namespace mgbench::results {
namespace {

using h5::check_status;

/// The string type `memory` in the character set of `stored` where both are strings and differ: mgbench
/// writes UTF-8, another tool may write ASCII (h5py's "S" dtype), and HDF5 converts between no two
/// character sets ("no appropriate function for conversion path"). An ASCII string's bytes are its
/// UTF-8, so reading them as stored loses nothing. Otherwise a copy of `memory`.
h5::Handle in_stored_charset(hid_t memory, hid_t stored, const std::string& what) {
  h5::Handle type = h5::wrap_type(H5Tcopy(memory), what);
  if (H5Tget_class(memory) == H5T_STRING && H5Tget_class(stored) == H5T_STRING &&
      H5Tget_cset(stored) != H5Tget_cset(memory)) {
    check_status(H5Tset_cset(type, H5Tget_cset(stored)), what);
  }
  return type;
}

/// The compound `memory` with each string member in the character set of the same-named member of the
/// stored compound `stored` (in_stored_charset); members `stored` lacks as they are (read as defaults).
h5::Handle with_stored_charsets(hid_t memory, hid_t stored, const std::string& what) {
  h5::Handle out = h5::wrap_type(H5Tcreate(H5T_COMPOUND, H5Tget_size(memory)), what);
  const int members = H5Tget_nmembers(memory);
  for (int k = 0; k < members; ++k) {
    char* raw = H5Tget_member_name(memory, static_cast<unsigned>(k));
    const std::string name = raw != nullptr ? raw : "";
    H5free_memory(raw);
    h5::Handle type = h5::wrap_type(H5Tget_member_type(memory, static_cast<unsigned>(k)), what);
    const int j = H5Tget_class(stored) == H5T_COMPOUND ? H5Tget_member_index(stored, name.c_str()) : -1;
    if (j >= 0) {
      h5::Handle stored_member = h5::wrap_type(H5Tget_member_type(stored, static_cast<unsigned>(j)), what);
      type = in_stored_charset(type, stored_member, what);
    }
    check_status(H5Tinsert(out, name.c_str(), H5Tget_member_offset(memory, static_cast<unsigned>(k)), type), what);
  }
  return out;
}

std::string read_fixed_string(hid_t group, const char* name, std::size_t bytes, const std::string& where) {
  if (!h5::link_exists(group, name)) return {};
  h5::Handle ds = h5::wrap_dataset(H5Dopen2(group, name, H5P_DEFAULT), fmt::format("open {}/{}", where, name));
  // One string: a dataset of several would be read past the buffer (found by tests/fuzz/fuzz_results).
  h5::Handle space = h5::wrap_space(H5Dget_space(ds), fmt::format("space of {}/{}", where, name));
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  MGBENCH_REQUIRE(n == 1, ResultsError, "{}/{}: {} strings where mgbench writes one (not an mgbench table)", where,
                  name, n);
  const std::string what = fmt::format("type of {}/{}", where, name);
  h5::Handle stored = h5::wrap_type(H5Dget_type(ds), what);
  h5::Handle type = in_stored_charset(h5::fixed_string_type(bytes), stored, what);
  std::string value(bytes, '\0');
  check_status(H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, value.data()), fmt::format("read {}/{}", where, name));
  const auto end = value.find('\0');
  if (end != std::string::npos) value.resize(end);
  return value;
}

constexpr hsize_t kBlockRows = 4096;

/// The rows of the table `ds` (dataspace `space`, path `table`) that its file stores, at most `extent`:
/// a contiguous one's allocated storage over `row_bytes` (as stored), a compact one's extent, a chunked
/// one's allocated chunks x their rows (rows of chunks never written are fill and carry nothing). The
/// bound of a read: a table another tool rewrote, or a damaged one, may claim 10^12 rows never stored.
hsize_t stored_rows(hid_t ds, hid_t space, hsize_t extent, hsize_t row_bytes, const std::string& table) {
  h5::Handle dcpl = h5::wrap_plist(H5Dget_create_plist(ds), "creation property list of " + table);
  switch (H5Pget_layout(dcpl)) {
    case H5D_CONTIGUOUS:
      return std::min(extent, row_bytes == 0 ? extent : H5Dget_storage_size(ds) / row_bytes);
    case H5D_CHUNKED: {
      hsize_t chunk[H5S_MAX_RANK] = {};
      MGBENCH_REQUIRE(H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk) >= 1, ResultsError, "{}: unreadable chunk layout", table);
      hsize_t chunks = 0;
      check_status(H5Dget_num_chunks(ds, space, &chunks), "count the chunks of " + table);
      return chunks > extent / std::max<hsize_t>(chunk[0], 1) ? extent : std::min(extent, chunks * chunk[0]);
    }
    default:
      return extent;
  }
}

/// Reads the one- or two-dimensional table `ds` (`table` its path) kBlockRows rows at a time as
/// `memory` elements, up to the rows its file stores (stored_rows), and calls
/// `block(elements, width)` with each block (rows x width elements, row-major; width 1 for a 1-D
/// table or a scalar, read as one row) while it returns true: one block in memory at a time, whatever
/// the table's extent. Throws ResultsError when the table has another rank or cannot be read as
/// `memory`.
template <class Element, class Block>
void read_blocks(hid_t ds, hid_t memory, const std::string& table, Block&& block) {
  h5::Handle space = h5::wrap_space(H5Dget_space(ds), "space of " + table);
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<Element> buffer;
  if (rank == 0) {  // a scalar: one row (a one-row table as another tool may write it)
    buffer.assign(1, Element{});
    check_status(H5Dread(ds, memory, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer.data()), "read " + table);
    block(std::span<const Element>(buffer), hsize_t{1});
    return;
  }
  MGBENCH_REQUIRE(rank == 1 || (rank == 2 && H5Tget_class(memory) != H5T_COMPOUND), ResultsError,
                  "{}: {} dimensions where mgbench writes {} (not an mgbench table)", table, rank,
                  H5Tget_class(memory) == H5T_COMPOUND ? "one" : "one or two");
  hsize_t dims[2] = {0, 1};
  H5Sget_simple_extent_dims(space, dims, nullptr);
  const hsize_t width = dims[1];
  if (width == 0) return;
  h5::Handle stored = h5::wrap_type(H5Dget_type(ds), "type of " + table);
  const hsize_t rows = stored_rows(ds, space, dims[0], H5Tget_size(stored) * width, table);
  for (hsize_t start = 0; start < rows; start += kBlockRows) {
    const hsize_t count = std::min(kBlockRows, rows - start);
    const hsize_t offset[2] = {start, 0}, shape[2] = {count, width};
    check_status(H5Sselect_hyperslab(space, H5S_SELECT_SET, offset, nullptr, shape, nullptr), "select " + table);
    h5::Handle in_memory = h5::wrap_space(H5Screate_simple(rank, shape, nullptr), "memory space of " + table);
    buffer.assign(count * width, Element{});
    check_status(H5Dread(ds, memory, in_memory, space, H5P_DEFAULT, buffer.data()), "read " + table);
    if (!block(std::span<const Element>(buffer), width)) break;
  }
}

/// The rows of the 1-D record table `name` of `group` (absent: none) for which `written(row)` holds,
/// read in blocks up to the first block without one (the writer fills its rows in order; a table's
/// extent may be far larger than what was written) and up to `limit` rows. String members are read in
/// the table's character set. Throws ResultsError as read_blocks does.
template <class Record, class Written>
std::vector<Record> read_table(hid_t group, const char* name, hid_t type, const std::string& where, Written written,
                               std::size_t limit = std::numeric_limits<std::size_t>::max()) {
  std::vector<Record> rows;
  if (!h5::link_exists(group, name)) return rows;
  const std::string table = fmt::format("{}/{}", where, name);
  h5::Handle ds = h5::wrap_dataset(H5Dopen2(group, name, H5P_DEFAULT), "open " + table);
  h5::Handle stored = h5::wrap_type(H5Dget_type(ds), "type of " + table);
  h5::Handle memory = with_stored_charsets(type, stored, "type of " + table);
  read_blocks<Record>(ds, memory, table, [&](std::span<const Record> block, hsize_t) {
    bool any_written = false;
    for (const Record& row : block) {
      if (!written(row)) continue;
      any_written = true;
      rows.push_back(row);
      if (rows.size() == limit) return false;
    }
    return any_written;
  });
  return rows;
}

/// The first row of the one-row table `name` of `group`, as stored (fill values where unwritten);
/// nullopt where there is none.
template <class Record>
std::optional<Record> read_row(hid_t group, const char* name, hid_t type, const std::string& where) {
  auto rows = read_table<Record>(
      group, name, type, where, [](const Record&) { return true; }, 1);
  return rows.empty() ? std::nullopt : std::optional<Record>(rows.front());
}

/// Rank `rank_group`'s steps table as (epoch, step_s, collective_s, cuda_graph), unwritten rows kept
/// in place (epoch -1): fields every schema's steps table has, or reads as 0 (the broadcast's and the
/// loss normaliser's phases before schema 6) or kGraphNotRecorded (cuda_graph before schema 15). Read in blocks up to
/// the first block without a written row: the loop writes its rows in order, and the table is preallocated for the
/// planned steps. Throws ResultsError when the table is not one-dimensional or cannot be read as those fields.
std::vector<StepTime> read_step_times(hid_t rank_group, const std::string& where) {
  if (!h5::link_exists(rank_group, "steps")) return {};
  struct Row {
    std::int32_t epoch = -1;
    double step_s = 0, allreduce_s = 0, buffer_broadcast_s = 0, loss_reduce_s = 0;
    std::int8_t cuda_graph = kGraphNotRecorded;
  };
  h5::Handle type = h5::wrap_type(H5Tcreate(H5T_COMPOUND, sizeof(Row)), "step time type");
  check_status(H5Tinsert(type, "epoch", offsetof(Row, epoch), H5T_NATIVE_INT32), "compound member epoch");
  check_status(H5Tinsert(type, "cuda_graph", offsetof(Row, cuda_graph), H5T_NATIVE_INT8), "member cuda_graph");
  for (const auto& [name, offset] :
       {std::pair{"step_s", offsetof(Row, step_s)}, std::pair{"allreduce_s", offsetof(Row, allreduce_s)},
        std::pair{"buffer_broadcast_s", offsetof(Row, buffer_broadcast_s)},
        std::pair{"loss_reduce_s", offsetof(Row, loss_reduce_s)}}) {
    check_status(H5Tinsert(type, name, offset, H5T_NATIVE_DOUBLE), fmt::format("compound member {}", name));
  }
  const std::string table = where + "/steps";
  h5::Handle ds = h5::wrap_dataset(H5Dopen2(rank_group, "steps", H5P_DEFAULT), "open " + table);
  std::vector<StepTime> out;
  read_blocks<Row>(ds, type, table, [&](std::span<const Row> block, hsize_t) {
    bool any_written = false;
    for (const Row& row : block) {
      // A step takes time: a zero-filled row (a table another tool made, or a damaged one) is none.
      const bool written = row.epoch >= 0 && std::isfinite(row.step_s) && row.step_s > 0;
      any_written = any_written || written;
      out.push_back({written ? row.epoch : -1, row.step_s, row.allreduce_s + row.buffer_broadcast_s + row.loss_reduce_s,
                     row.cuda_graph});
    }
    return any_written;
  });
  return out;
}

struct LinkNames {
  std::vector<std::string> names;
};

herr_t collect_link(hid_t, const char* name, const H5L_info_t*, void* data) {
  static_cast<LinkNames*>(data)->names.emplace_back(name);
  return 0;
}

std::vector<std::string> child_names(hid_t group, const std::string& where) {
  LinkNames out;
  hsize_t index = 0;
  // Creation order is tracked only when the group was made with it; name order is the fallback.
  if (H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, &index, collect_link, &out) < 0) {
    check_status(-1, fmt::format("list {}", where));
  }
  return out.names;
}

}  // namespace

std::optional<std::string> text_attribute(const h5::Attributes& attributes, const std::string& name) {
  for (const auto& [key, value] : attributes) {
    if (key == name && std::holds_alternative<std::string>(value)) return std::get<std::string>(value);
  }
  return std::nullopt;
}

std::optional<std::string> RunRecord::text(const std::string& name) const { return text_attribute(attributes, name); }

std::optional<std::int64_t> RunRecord::integer(const std::string& name) const {
  for (const auto& [key, value] : attributes) {
    if (key == name && std::holds_alternative<std::int64_t>(value)) return std::get<std::int64_t>(value);
  }
  return std::nullopt;
}

std::optional<double> RunRecord::real(const std::string& name) const {
  for (const auto& [key, value] : attributes) {
    if (key != name) continue;
    if (const auto* d = std::get_if<double>(&value)) return *d;
    if (const auto* i = std::get_if<std::int64_t>(&value)) return static_cast<double>(*i);
  }
  return std::nullopt;
}

std::string RunRecord::display(const std::string& name) const {
  for (const auto& [key, value] : attributes) {
    if (key != name) continue;
    if (const auto* s = std::get_if<std::string>(&value)) return *s;
    if (const auto* i = std::get_if<std::int64_t>(&value)) return std::to_string(*i);
    return fmt::format("{:g}", std::get<double>(value));
  }
  return {};
}

namespace {

/// The results file at path, opened read-only. Throws ResultsError naming the file when it is missing,
/// not HDF5, or not an mgbench results file.
h5::Handle open_to_read(const std::string& path) {
  MGBENCH_REQUIRE(access(path.c_str(), R_OK) == 0, ResultsError, "results file '{}' does not exist or is not readable",
                  path);
  require_regular_file(path, "results file");  // a FIFO would block H5Fis_hdf5's open
  MGBENCH_REQUIRE(H5Fis_hdf5(path.c_str()) > 0, ResultsError, "'{}' is not an HDF5 file", path);
  h5::Handle fapl = h5::wrap_plist(H5Pcreate(H5P_FILE_ACCESS), "file access list");
  // A running job holds the file open; reading it while it runs is allowed.
  H5Pset_file_locking(fapl, false, true);
  h5::Handle file = h5::wrap_file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), fmt::format("open '{}'", path));
  MGBENCH_REQUIRE(is_results_file(file), ResultsError,
                  "'{}' is not an mgbench results file (no root attribute schema = \"{}\" with a /runs group)", path,
                  kSchemaName);
  return file;
}

/// A rank's CUDA tables (rank_<r>/cuda_summary, cuda_api, cuda_kernels) appended to the run's, their
/// unwritten rows left out.
void read_cuda_tables(hid_t rank_group, const std::string& rank_where, RunRecord& run) {
  const auto summary = read_row<CudaSummaryRecord>(rank_group, "cuda_summary", cuda_summary_type(), rank_where);
  auto api = read_table<CudaApiRecord>(rank_group, "cuda_api", cuda_api_type(), rank_where,
                                       [](const CudaApiRecord& a) { return a.name[0] != '\0'; });
  auto kernels = read_table<CudaKernelRecord>(rank_group, "cuda_kernels", cuda_kernel_type(), rank_where,
                                              [](const CudaKernelRecord& k) { return k.name[0] != '\0'; });
  run.cuda.push_back(summary.value_or(CudaSummaryRecord{}));
  run.cuda_api.push_back(std::move(api));
  run.cuda_kernels.push_back(std::move(kernels));
}

/// A rank's per-step recipe metrics (rank_<r>/metrics, `what` its path) appended to the run's: the
/// rows written, and the column names where the run has none yet.
void read_metrics(hid_t rank_group, const std::string& what, RunRecord& run) {
  h5::Handle ds = h5::wrap_dataset(H5Dopen2(rank_group, "metrics", H5P_DEFAULT), "open " + what);
  h5::Handle space = h5::wrap_space(H5Dget_space(ds), "space of " + what);
  MGBENCH_REQUIRE(H5Sget_simple_extent_ndims(space) == 2, ResultsError, "{}: expected a 2-D table", what);
  if (run.metric_names.empty()) {
    for (const auto& [name, value] : h5::read_attributes(ds)) {
      if (name != "columns" || !std::holds_alternative<std::string>(value)) continue;
      std::stringstream columns(std::get<std::string>(value));
      for (std::string column; std::getline(columns, column, ',');) run.metric_names.push_back(column);
    }
  }
  std::vector<std::vector<double>> rows;
  // Rows are written in step order; unwritten ones keep their NaN fill.
  read_blocks<double>(ds, H5T_NATIVE_DOUBLE, what, [&](std::span<const double> block, hsize_t width) {
    bool any_written = false;
    for (auto row = block.begin(); row != block.end(); row += static_cast<std::ptrdiff_t>(width)) {
      const auto end = row + static_cast<std::ptrdiff_t>(width);
      if (std::none_of(row, end, [](double v) { return std::isfinite(v); })) continue;
      any_written = true;
      rows.emplace_back(row, end);
    }
    return any_written;
  });
  run.metrics.push_back(std::move(rows));
}

/// Every rank_<r> group of a run (`where` its path), r = 0, 1, ... while there is one: its attributes
/// and tables appended to the run's, their unwritten rows left out.
void read_ranks(hid_t group, const std::string& where, hid_t epoch_type, RunRecord& run) {
  StepSkewSum skew;
  for (int r = 0;; ++r) {
    const std::string rank_name = fmt::format("rank_{}", r);
    if (!h5::link_exists(group, rank_name)) break;
    h5::Handle rank_group =
        h5::wrap_group(H5Gopen2(group, rank_name.c_str(), H5P_DEFAULT), "open " + where + "/" + rank_name);
    run.rank_attributes.push_back(h5::read_attributes(rank_group));
    run.epochs.push_back(read_table<EpochRecord>(rank_group, "epochs", epoch_type, where + "/" + rank_name,
                                                 [](const EpochRecord& e) { return e.epoch >= 0; }));
    const std::vector<StepTime> steps = read_step_times(rank_group, where + "/" + rank_name);
    if (r == 0) {
      run.first_step_s = first_step_s(steps);
      run.graph_steps = graph_steps(steps);
    }
    skew.add_rank(steps);
    if (h5::link_exists(rank_group, "cuda_summary")) read_cuda_tables(rank_group, where + "/" + rank_name, run);
    if (h5::link_exists(rank_group, "comm")) {
      run.comm.push_back(read_table<CommRecord>(rank_group, "comm", comm_record_type(), where + "/" + rank_name,
                                                [](const CommRecord& c) { return c.bytes >= 0; }));
    }
    if (h5::link_exists(rank_group, "energy")) {
      const auto energy = read_row<EnergyRecord>(rank_group, "energy", energy_record_type(), where + "/" + rank_name);
      run.energy.push_back(energy.value_or(EnergyRecord{}));
      run.telemetry.push_back(
          read_table<TelemetryRecord>(rank_group, "telemetry", telemetry_record_type(), where + "/" + rank_name,
                                      [](const TelemetryRecord& t) { return std::isfinite(t.t_s); }));
    }
    if (h5::link_exists(rank_group, "metrics")) read_metrics(rank_group, where + "/" + rank_name + "/metrics", run);
  }
  run.step_skew = skew.result();
}

/// The run /runs/<id> of the file at path. `written`: a job holds the file, so a run stored
/// "running" is running (else it was aborted). Throws ResultsError for a run of a newer schema.
RunRecord read_run(hid_t runs, const std::string& path, const std::string& id, bool written, hid_t epoch_type,
                   hid_t summary_type) {
  const std::string where = fmt::format("'{}' /runs/{}", path, id);
  h5::Handle group = h5::wrap_group(H5Gopen2(runs, id.c_str(), H5P_DEFAULT), "open " + where);
  RunRecord run;
  run.file = path;
  run.run_id = id;
  run.attributes = h5::read_attributes(group);
  // A newer mgbench's layout read with this one's would show wrong or empty columns: refuse it.
  if (const auto version = run.integer("schema_version"); version && *version > kSchemaVersion) {
    throw ResultsError(
        fmt::format("{} was written with results schema version {}; this mgbench reads versions up "
                    "to {} (docs/results-schema.md): use the mgbench that wrote it, or a newer one",
                    where, *version, kSchemaVersion));
  }
  run.status = read_fixed_string(group, "status", kStatusBytes, where);
  run.error = read_fixed_string(group, "error", kErrorBytes, where);
  if (run.status == kStatusRunning && !written) {
    run.status = kStatusAborted;
    if (run.error.empty()) {
      run.error =
          "the job ended without closing the run (its ranks killed, or a node or link lost): nothing "
          "recorded why";
    }
  }
  if (const auto summary = read_row<RunSummary>(group, "summary", summary_type, where)) run.summary = *summary;
  read_ranks(group, where, epoch_type, run);
  return run;
}

}  // namespace

std::vector<RunRecord> read_runs(const std::string& path) {
  h5::silence_error_stack();
  h5::Handle file = open_to_read(path);
  h5::Handle runs = h5::wrap_group(H5Gopen2(file, "runs", H5P_DEFAULT), fmt::format("open /runs in '{}'", path));

  const h5::Handle epoch_type = epoch_record_type();
  const h5::Handle summary_type = run_summary_type();
  std::vector<RunRecord> out;
  const bool written = being_written(path);  // a job holds the file: its "running" run is running
  for (const std::string& id : child_names(runs, "/runs")) {
    out.push_back(read_run(runs, path, id, written, epoch_type, summary_type));
  }
  // A run resumed at another world size is a run of its own, linked back by `continues_run`.
  for (const RunRecord& later : out) {
    const std::optional<std::string> earlier = later.text("continues_run");
    if (!earlier) continue;
    for (RunRecord& r : out) {
      if (r.run_id == *earlier) r.continued_by = later.run_id;
    }
  }
  return out;
}

}  // namespace mgbench::results
