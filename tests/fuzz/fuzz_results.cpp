// The results-file reader (`mgbench report`, predict, the resume path) on files of foreign or
// damaged layout. The input does not become the file's bytes -- HDF5's own parser of bytes is
// libhdf5's to fuzz -- but drives a generator that writes a well-formed HDF5 file of an
// arbitrary layout near mgbench's: /runs/<id> groups whose attributes, status / error / summary
// datasets and rank_<r> tables each take the right type and shape, or another one (another
// string length, more elements, a scalar, an integer instead of a record, a missing piece).
// mgbench's reader must read what it recognises and refuse the rest with a ResultsError.
#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>

#include <string>
#include <vector>

#include "fuzz_support.h"
#include "results/reader.h"
#include "results/schema.h"

namespace {

using mgbench::results::kSchemaName;

hid_t string_type(std::size_t length) {
  const hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, length);
  return t;
}

/// A dataset `name` in `group` of a type and shape the input picks; its bytes are the input's.
void add_dataset(FuzzedDataProvider& in, hid_t group, const char* name, hid_t right_type) {
  hid_t type = -1;
  switch (in.ConsumeIntegralInRange(0, 4)) {
    case 0:
      type = H5Tcopy(right_type);
      break;
    case 1:
      type = in.ConsumeBool()
                 ? string_type(in.ConsumeIntegralInRange<std::size_t>(1, 2048))
                 : H5Tcopy(mgbench::h5::fixed_string_type(in.ConsumeIntegralInRange<std::size_t>(1, 2048)));
      break;
    case 2:
      type = H5Tcopy(H5T_NATIVE_INT64);
      break;
    case 3:
      type = H5Tcopy(H5T_NATIVE_DOUBLE);
      break;
    default: {  // a compound with some of the right one's members, or others
      type = H5Tcreate(H5T_COMPOUND, 64);
      H5Tinsert(type, in.ConsumeBool() ? "loss" : "x", 0, H5T_NATIVE_DOUBLE);
      H5Tinsert(type, in.ConsumeBool() ? "epoch" : "y", 8, H5T_NATIVE_INT64);
    }
  }
  const int rank = in.ConsumeIntegralInRange(0, 3);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  hsize_t points = 1;
  for (auto& d : dims) {
    d = in.ConsumeIntegralInRange<hsize_t>(0, 6);
    points *= d;
  }
  const hid_t space = rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims.data(), nullptr);
  const hid_t ds = H5Dcreate2(group, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (ds >= 0) {
    std::vector<unsigned char> bytes(points * H5Tget_size(type));
    for (auto& b : bytes) b = in.ConsumeIntegral<unsigned char>();
    if (!bytes.empty()) H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data());
    H5Dclose(ds);
  }
  H5Sclose(space);
  H5Tclose(type);
}

void add_attribute(FuzzedDataProvider& in, hid_t object, const std::string& name) {
  const hid_t space = H5Screate(H5S_SCALAR);
  hid_t attr = -1;
  switch (in.ConsumeIntegralInRange(0, 2)) {
    case 0: {
      const hid_t type = H5Tcopy(H5T_C_S1);
      H5Tset_size(type, H5T_VARIABLE);
      attr = H5Acreate2(object, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
      const std::string text = in.ConsumeRandomLengthString(64);
      const char* p = text.c_str();
      H5Awrite(attr, type, &p);
      H5Tclose(type);
      break;
    }
    case 1: {
      attr = H5Acreate2(object, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
      const auto v = in.ConsumeIntegral<std::int64_t>();
      H5Awrite(attr, H5T_NATIVE_INT64, &v);
      break;
    }
    default: {
      attr = H5Acreate2(object, name.c_str(), H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT);
      const double v = in.ConsumeFloatingPoint<double>();
      H5Awrite(attr, H5T_NATIVE_DOUBLE, &v);
    }
  }
  if (attr >= 0) H5Aclose(attr);
  H5Sclose(space);
}

void write_file(FuzzedDataProvider& in, const std::string& path) {
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hid_t text = H5Tcopy(H5T_C_S1);
  H5Tset_size(text, H5T_VARIABLE);
  const hid_t scalar = H5Screate(H5S_SCALAR);
  const std::string schema = in.ConsumeBool() ? std::string(kSchemaName) : in.ConsumeRandomLengthString(20);
  const char* p = schema.c_str();
  const hid_t a = H5Acreate2(file, "schema", text, scalar, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, text, &p);
  H5Aclose(a);
  if (in.ConsumeBool()) {
    const hid_t runs = H5Gcreate2(file, "runs", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const int n_runs = in.ConsumeIntegralInRange(0, 3);
    for (int r = 0; r < n_runs; ++r) {
      const std::string id = "run" + std::to_string(r);
      const hid_t run = H5Gcreate2(runs, id.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      for (const char* name : {"schema_version", "task", "world_size", "precision", "epochs", "image_size"}) {
        if (in.ConsumeBool()) add_attribute(in, run, name);
      }
      const mgbench::h5::Handle status_type = mgbench::h5::fixed_string_type(mgbench::results::kStatusBytes);
      const mgbench::h5::Handle error_type = mgbench::h5::fixed_string_type(mgbench::results::kErrorBytes);
      const mgbench::h5::Handle summary_type = mgbench::results::run_summary_type();
      if (in.ConsumeBool()) add_dataset(in, run, "status", status_type);
      if (in.ConsumeBool()) add_dataset(in, run, "error", error_type);
      if (in.ConsumeBool()) add_dataset(in, run, "summary", summary_type);
      const int ranks = in.ConsumeIntegralInRange(0, 2);
      for (int k = 0; k < ranks; ++k) {
        const std::string rank_name = "rank_" + std::to_string(k);
        const hid_t g = H5Gcreate2(run, rank_name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        const mgbench::h5::Handle step_type = mgbench::results::step_record_type();
        const mgbench::h5::Handle epoch_type = mgbench::results::epoch_record_type();
        const mgbench::h5::Handle comm_type = mgbench::results::comm_record_type();
        if (in.ConsumeBool()) add_dataset(in, g, "steps", step_type);
        if (in.ConsumeBool()) add_dataset(in, g, "epochs", epoch_type);
        if (in.ConsumeBool()) add_dataset(in, g, "metrics", H5T_NATIVE_DOUBLE);
        if (in.ConsumeBool()) add_dataset(in, g, "comm", comm_type);
        if (in.ConsumeBool()) add_dataset(in, g, "cuda_summary", mgbench::results::cuda_summary_type());
        if (in.ConsumeBool()) add_dataset(in, g, "cuda_api", mgbench::results::cuda_api_type());
        H5Gclose(g);
      }
      H5Gclose(run);
    }
    H5Gclose(runs);
  }
  H5Sclose(scalar);
  H5Tclose(text);
  H5Fclose(file);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // the generator's own HDF5 errors (odd shapes) are quiet
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const std::string path = mgbench::fuzz::write_input(nullptr, 0, "results.h5");
  write_file(in, path);
  mgbench::fuzz::expect_clean_errors([&] {
    for (const auto& run : mgbench::results::read_runs(path)) {
      (void)run.display("task");
      (void)run.real("world_size");
    }
  });
  return 0;
}
