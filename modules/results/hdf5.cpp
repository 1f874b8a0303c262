#include "results/hdf5.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace mgbench::h5 {
namespace {

herr_t innermost_message(unsigned n, const H5E_error2_t* err, void* out) {
  if (n == 0 && err != nullptr && err->desc != nullptr) {
    *static_cast<std::string*>(out) = fmt::format("{} (in {})", err->desc, err->func_name ? err->func_name : "?");
  }
  return 0;
}

[[noreturn]] void throw_error(const std::string& what) {
  std::string detail;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost_message, &detail);
  H5Eclear2(H5E_DEFAULT);
  throw ResultsError(detail.empty() ? what : fmt::format("{}: {}", what, detail));
}

}  // namespace

void silence_error_stack() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

hid_t check(hid_t id, const std::string& what) {
  if (id < 0) throw_error(what);
  return id;
}

void check_status(herr_t status, const std::string& what) {
  if (status < 0) throw_error(what);
}

Handle wrap_file(hid_t id, const std::string& what) { return {check(id, what), H5Fclose}; }
Handle wrap_group(hid_t id, const std::string& what) { return {check(id, what), H5Gclose}; }
Handle wrap_dataset(hid_t id, const std::string& what) { return {check(id, what), H5Dclose}; }
Handle wrap_space(hid_t id, const std::string& what) { return {check(id, what), H5Sclose}; }
Handle wrap_type(hid_t id, const std::string& what) { return {check(id, what), H5Tclose}; }
Handle wrap_plist(hid_t id, const std::string& what) { return {check(id, what), H5Pclose}; }
Handle wrap_attr(hid_t id, const std::string& what) { return {check(id, what), H5Aclose}; }

Handle fixed_string_type(std::size_t length) {
  Handle type = wrap_type(H5Tcopy(H5T_C_S1), "copy string type");
  check_status(H5Tset_size(type, length), "set string size");
  check_status(H5Tset_strpad(type, H5T_STR_NULLPAD), "set string padding");
  check_status(H5Tset_cset(type, H5T_CSET_UTF8), "set string charset");
  return type;
}

void write_attribute(hid_t object, const std::string& name, const AttrValue& value) {
  const std::string what = fmt::format("write attribute '{}'", name);
  if (H5Aexists(object, name.c_str()) > 0) check_status(H5Adelete(object, name.c_str()), what);  // replaced
  Handle space = wrap_space(H5Screate(H5S_SCALAR), what);
  if (const auto* s = std::get_if<std::string>(&value)) {
    Handle type = wrap_type(H5Tcopy(H5T_C_S1), what);
    check_status(H5Tset_size(type, H5T_VARIABLE), what);
    check_status(H5Tset_cset(type, H5T_CSET_UTF8), what);
    Handle attr = wrap_attr(H5Acreate2(object, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), what);
    const char* data = s->c_str();
    check_status(H5Awrite(attr, type, &data), what);
  } else if (const auto* i = std::get_if<std::int64_t>(&value)) {
    Handle attr = wrap_attr(H5Acreate2(object, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), what);
    check_status(H5Awrite(attr, H5T_NATIVE_INT64, i), what);
  } else {
    const double d = std::get<double>(value);
    Handle attr = wrap_attr(H5Acreate2(object, name.c_str(), H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT), what);
    check_status(H5Awrite(attr, H5T_NATIVE_DOUBLE, &d), what);
  }
}

std::string exact_text(const AttrValue& value) {
  if (const auto* s = std::get_if<std::string>(&value)) return *s;
  if (const auto* i = std::get_if<std::int64_t>(&value)) return std::to_string(*i);
  return fmt::format("{:.17g}", std::get<double>(value));
}

void write_attributes(hid_t object, const Attributes& attributes) {
  for (const auto& [name, value] : attributes) write_attribute(object, name, value);
}

namespace {
herr_t read_one_attribute(hid_t location, const char* name, const H5A_info_t*, void* data) {
  auto* out = static_cast<Attributes*>(data);
  Handle attr = wrap_attr(H5Aopen(location, name, H5P_DEFAULT), fmt::format("open attribute '{}'", name));
  Handle type = wrap_type(H5Aget_type(attr), "attribute type");
  Handle space = wrap_space(H5Aget_space(attr), "attribute space");
  if (H5Sget_simple_extent_npoints(space) != 1) return 0;  // only scalars are mgbench's
  switch (H5Tget_class(type)) {
    case H5T_STRING: {
      if (H5Tis_variable_str(type) > 0) {
        // The stored type as memory type: HDF5 does not convert between ASCII and UTF-8.
        char* value = nullptr;
        check_status(H5Aread(attr, type, &value), fmt::format("read attribute '{}'", name));
        out->emplace_back(name, std::string(value != nullptr ? value : ""));
        H5free_memory(value);
      } else {
        std::string value(H5Tget_size(type), '\0');
        check_status(H5Aread(attr, type, value.data()), fmt::format("read attribute '{}'", name));
        value.resize(value.find('\0') == std::string::npos ? value.size() : value.find('\0'));
        out->emplace_back(name, value);
      }
      break;
    }
    case H5T_INTEGER: {
      std::int64_t value = 0;
      check_status(H5Aread(attr, H5T_NATIVE_INT64, &value), fmt::format("read attribute '{}'", name));
      out->emplace_back(name, value);
      break;
    }
    case H5T_FLOAT: {
      double value = 0;
      check_status(H5Aread(attr, H5T_NATIVE_DOUBLE, &value), fmt::format("read attribute '{}'", name));
      out->emplace_back(name, value);
      break;
    }
    default:
      break;
  }
  return 0;
}
}  // namespace

void merge_attributes(Attributes& into, Attributes more) {
  for (auto& attribute : more) {
    auto it = std::find_if(into.begin(), into.end(), [&](const auto& a) { return a.first == attribute.first; });
    if (it != into.end()) {
      it->second = std::move(attribute.second);
    } else {
      into.push_back(std::move(attribute));
    }
  }
}

Attributes read_attributes(hid_t object) {
  Attributes out;
  hsize_t index = 0;
  check_status(H5Aiterate2(object, H5_INDEX_NAME, H5_ITER_INC, &index, read_one_attribute, &out), "iterate attributes");
  return out;
}

bool link_exists(hid_t location, const std::string& path) {
  const htri_t r = H5Lexists(location, path.c_str(), H5P_DEFAULT);
  if (r < 0) throw_error(fmt::format("check link '{}'", path));
  return r > 0;
}

}  // namespace mgbench::h5
