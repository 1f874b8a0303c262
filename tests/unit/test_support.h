#pragma once
// Helpers shared by the tests: where the oracle files and the shared data are, temp dirs.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include <c10/core/DefaultDtype.h>
#include <c10/core/ScalarType.h>
#include <c10/util/typeid.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/durable.h"
#include "test_inputs.h"
#include "test_paths.h"

namespace mgbench::test {

/// Loads an oracle JSON file; empty json when missing (the caller skips).
inline nlohmann::json load_oracle_json(const std::string& name) {
  const auto path = std::filesystem::path(oracle_dir()) / name;
  if (oracle_dir().empty() || !std::filesystem::exists(path)) return {};
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

/// Skips (fails in CI) when the oracle JSON `json`, loaded from file `name`, was not found.
#define MGBENCH_SKIP_WITHOUT_ORACLE(json, name) \
  if (!(json).is_null()) {                      \
  } else                                        \
    MGBENCH_REQUIRE_INPUTS(::mgbench::test::oracle_dir() + "/" + (name))

/// Expects fn() to throw Exception with a message containing every one of needles.
template <class Exception, class Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one mentioning '" << *needles.begin() << "'";
  } catch (const Exception& e) {
    for (const auto& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "expected '" << needle << "' in: " << e.what();
    }
  }
}

/// Removes a test's directory tree; a failure is reported, not thrown (destructors call it).
inline void remove_quietly(const std::string& path) {
  try {
    mgbench::remove_tree(path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test cleanup: %s\n", e.what());
  }
}

/// A fresh temporary directory, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "mgbench-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { remove_quietly(path_); }
  std::string file(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// The default dtype (the one modules build their parameters in) set to `dtype` while alive.
class DefaultDtype {
 public:
  explicit DefaultDtype(c10::ScalarType dtype) : previous_(c10::get_default_dtype()) {
    c10::set_default_dtype(caffe2::TypeMeta::fromScalarType(dtype));
  }
  ~DefaultDtype() { c10::set_default_dtype(previous_); }
  DefaultDtype(const DefaultDtype&) = delete;
  DefaultDtype& operator=(const DefaultDtype&) = delete;

 private:
  caffe2::TypeMeta previous_;
};

inline void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace mgbench::test
