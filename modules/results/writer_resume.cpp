// Resuming a run: the ResultsWriter that reopens a preempted run's tables in an existing results
// file, checks that they fit this job (world size, layout) and counts the resume.
#include "results/writer.h"

#include <array>

#include <fmt/format.h>

#include "core/error.h"
#include "core/mpi_strings.h"
#include "core/timer.h"
#include "core/watchdog.h"

namespace mgbench::results {
namespace {

using h5::check_status;

}  // namespace

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
    h5::Handle energy = open("energy", false);
    h5::Handle telemetry = open("telemetry", false);
    if (r == rank_) {
      own_ = {std::move(steps),    std::move(epochs),       std::move(indices), std::move(cuda_summary),
              std::move(cuda_api), std::move(cuda_kernels), std::move(metrics), std::move(comm_rows),
              std::move(energy),   std::move(telemetry)};
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
      layout_.telemetry == own_.energy.valid() &&
      (!own_.metrics.valid() || rows(own_.metrics)[1] == static_cast<std::int64_t>(layout_.metrics.size()));
  // Within agree_on: a mismatch on one rank fails every rank alike.
  MGBENCH_REQUIRE(same, ResultsError,
                  "run '{}' in '{}' has tables of another shape than this job's (epochs, steps per epoch, indices, "
                  "CUDA or recipe metrics, telemetry differ): it is not the same configuration",
                  run_id_, path_);
}

}  // namespace mgbench::results
