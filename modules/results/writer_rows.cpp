// The writes of a running run: each rank writes its own rows of its tables (raw data in place, no
// HDF5 metadata, independent of the other ranks), rank 0 the run's summary and status.
#include "results/writer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace mgbench::results {
namespace {

using h5::check_status;

}  // namespace

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

void ResultsWriter::write_telemetry(const EnergyRecord& energy, std::span<const TelemetryRecord> readings) {
  MGBENCH_REQUIRE(own_.energy.valid(), ResultsError, "write_telemetry: the run was created without telemetry tables");
  MGBENCH_REQUIRE(static_cast<std::int64_t>(readings.size()) <= kTelemetryRows, ResultsError,
                  "write_telemetry: {} readings exceed {}", readings.size(), kTelemetryRows);
  write_rows(own_.energy, energy_record_type(), 0, 1, &energy, "energy");
  if (!readings.empty()) {
    write_rows(own_.telemetry, telemetry_record_type(), 0, static_cast<std::int64_t>(readings.size()), readings.data(),
               "telemetry");
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
  MGBENCH_REQUIRE(own_.indices.valid() && static_cast<std::int64_t>(indices.size()) <= layout_.indices_per_epoch,
                  ResultsError, "rank {}: {} indices for epoch {}, the results layout reserved {}", rank_,
                  indices.size(), epoch, layout_.indices_per_epoch);
  std::vector<std::int64_t> row(indices.begin(), indices.end());
  row.resize(static_cast<std::size_t>(layout_.indices_per_epoch), -1);  // a stopped epoch: the rest not computed
  write_rows(own_.indices, H5T_NATIVE_INT64, epoch, 1, row.data(), "indices");
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

}  // namespace mgbench::results
