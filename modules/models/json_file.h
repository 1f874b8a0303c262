#pragma once
// JSON files of checkpoints and adapters (config.json, adapter_config.json, qat_config.json,
// model.safetensors.index.json): read with errors naming the file, written durably.
#include <string>

#include <nlohmann/json.hpp>

namespace mgbench::models {

/// The parsed file. Throws DataError "<what> '<path>': cannot open the file" or "... not valid
/// JSON: <parser's message>".
nlohmann::json read_json_file(const std::string& path, const std::string& what = "");

/// Writes json (2-space indent, newline-terminated) and fsyncs it. Throws DataError naming the path.
void write_json_file(const std::string& path, const nlohmann::json& json);

}  // namespace mgbench::models
