#include "models/json_file.h"

#include <fstream>

#include <fmt/format.h>

#include "core/durable.h"
#include "core/error.h"
#include "core/input_file.h"

namespace mgbench::models {

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
