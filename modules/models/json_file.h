#pragma once
// JSON files of checkpoints and adapters (config.json, adapter_config.json, qat_config.json,
// model.safetensors.index.json): read with errors naming the file, written durably.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mgbench::models {

/// The parsed file. Throws DataError "<what> '<path>': cannot open the file" or "... not valid
/// JSON: <parser's message>".
nlohmann::json read_json_file(const std::string& path, const std::string& what = "");

/// v as a 64-bit integer: a JSON integer within int64's range. (nlohmann's get<std::int64_t>()
/// also takes a float and casts it: undefined behaviour beyond the range, e.g. a shape of 2.4e27;
/// found by tests/fuzz/fuzz_safetensors.) Throws nlohmann::json::type_error (302) otherwise, as
/// get<> does for other types, so callers' handlers of malformed JSON name the file.
std::int64_t json_integer(const nlohmann::json& v);
/// An array of json_integer values.
std::vector<std::int64_t> json_integers(const nlohmann::json& v);

/// Writes json (2-space indent, newline-terminated) and fsyncs it. Throws DataError naming the path.
void write_json_file(const std::string& path, const nlohmann::json& json);

}  // namespace mgbench::models
