#pragma once
// A thin RAII layer over the HDF5 C API: owned handles, checked calls, attributes.
// Errors become mgbench::ResultsError carrying the operation and HDF5's own innermost message.
#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace mgbench::h5 {

/// An owned hid_t closed with the matching H5?close function. Move-only.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }  // NOLINT: handles pass straight into the C API
  bool valid() const { return id_ >= 0; }
  void reset() noexcept {
    if (id_ >= 0 && closer_ != nullptr) closer_(id_);
    id_ = H5I_INVALID_HID;
  }
  /// Releases ownership without closing (used when a process is about to abort).
  hid_t release() noexcept { return std::exchange(id_, H5I_INVALID_HID); }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

/// Disables HDF5's automatic error printing (errors are reported through exceptions instead).
void silence_error_stack();

/// Throws ResultsError("<what>: <HDF5 message>") when id < 0; returns id otherwise.
hid_t check(hid_t id, const std::string& what);
/// Throws ResultsError when status < 0.
void check_status(herr_t status, const std::string& what);

Handle wrap_file(hid_t id, const std::string& what);
Handle wrap_group(hid_t id, const std::string& what);
Handle wrap_dataset(hid_t id, const std::string& what);
Handle wrap_space(hid_t id, const std::string& what);
Handle wrap_type(hid_t id, const std::string& what);
Handle wrap_plist(hid_t id, const std::string& what);
Handle wrap_attr(hid_t id, const std::string& what);

/// The value of an attribute: UTF-8 string, 64-bit integer or double.
using AttrValue = std::variant<std::string, std::int64_t, double>;
using Attributes = std::vector<std::pair<std::string, AttrValue>>;

/// The value as exact text: a string as is, an integer in decimal, a double with 17 significant
/// digits (reads back to the same double). For encodings and identities, not for display.
std::string exact_text(const AttrValue& value);

/// Writes (creates, or replaces) a scalar attribute: strings as variable-length UTF-8, numbers as
/// native int64 / double. In a parallel file this is collective with identical arguments.
void write_attribute(hid_t object, const std::string& name, const AttrValue& value);
void write_attributes(hid_t object, const Attributes& attributes);
/// Reads every scalar attribute of object that is a string, integer or float.
Attributes read_attributes(hid_t object);

/// Attributes in `more` replace those of the same name in `into`; the others are appended, in order.
void merge_attributes(Attributes& into, Attributes more);

/// A fixed-length, NUL-padded C string type of `length` bytes (for raw string datasets).
Handle fixed_string_type(std::size_t length);

bool link_exists(hid_t location, const std::string& path);

}  // namespace mgbench::h5
