#include "models/json_file.h"

#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "core/durable.h"
#include "core/error.h"
#include "core/input_file.h"

namespace mgbench::models {

std::int64_t json_integer(const nlohmann::json& v) {
  const bool fits =
      v.is_number_integer() &&
      (!v.is_number_unsigned() || v.get<std::uint64_t>() <= std::uint64_t{std::numeric_limits<std::int64_t>::max()});
  if (!fits) {
    const std::string text = v.dump();
    throw nlohmann::json::type_error::create(
        302, fmt::format("expected an integer, got {} {}", v.type_name(), text.substr(0, 40)), &v);
  }
  return v.get<std::int64_t>();
}

std::vector<std::int64_t> json_integers(const nlohmann::json& v) {
  if (!v.is_array()) {
    throw nlohmann::json::type_error::create(302, fmt::format("expected an array of integers, got {}", v.type_name()),
                                             &v);
  }
  std::vector<std::int64_t> out;
  out.reserve(v.size());
  for (const auto& x : v) out.push_back(json_integer(x));
  return out;
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  const std::string name = what.empty() ? fmt::format("'{}'", path) : fmt::format("{} '{}'", what, path);
  require_regular_file(path, what.empty() ? "JSON file" : what);
  std::ifstream in(path);
  MGBENCH_REQUIRE(in.good(), DataError, "{}: cannot open the file", name);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: not valid JSON: {}", name, e.what()));
  }
}

void write_json_file(const std::string& path, const nlohmann::json& json) {
  {
    std::ofstream out(path);
    out << json.dump(2) << "\n";
    out.flush();
    MGBENCH_REQUIRE(out.good(), DataError, "'{}': write failed", path);
  }
  sync_to_disk(path);
}

}  // namespace mgbench::models
