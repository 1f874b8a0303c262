#include "models/safetensors_header.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "models/json_file.h"

namespace mgbench::models {
namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100 * 1024 * 1024;  // the reference implementation's limit

}  // namespace

std::size_t safetensors_element_bytes(std::string_view dtype) {
  static constexpr std::pair<std::string_view, std::size_t> kSizes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2},
                                                                        {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
                                                                        {"U8", 1},  {"BOOL", 1}};
  for (const auto& [name, bytes] : kSizes) {
    if (name == dtype) return bytes;
  }
  return 0;
}

SafetensorsHeader parse_safetensors_header(std::string_view file, const std::string& path) {
  return parse_safetensors_header(file, file.size(), path);
}

SafetensorsHeader parse_safetensors_header(std::string_view head, std::uint64_t file_size, const std::string& path) {
  SafetensorsHeader out;
  MGBENCH_REQUIRE(file_size >= 8 && head.size() >= 8, DataError,
                  "safetensors '{}': {} bytes, shorter than the 8-byte header length", path, file_size);
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, head.data(), 8);  // little-endian, as x86-64 and aarch64 are
  MGBENCH_REQUIRE(header_bytes <= kMaxHeaderBytes && header_bytes <= file_size - 8 && header_bytes <= head.size() - 8,
                  DataError,
                  "safetensors '{}': header length {} exceeds the file ({} bytes): truncated or not safetensors", path,
                  header_bytes, file_size);
  out.data_offset = 8 + static_cast<std::size_t>(header_bytes);
  const std::size_t data_bytes = file_size - out.data_offset;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(head.data() + 8, head.data() + out.data_offset);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("safetensors '{}': header is not valid JSON: {}", path, e.what()));
  }
  MGBENCH_REQUIRE(header.is_object(), DataError, "safetensors '{}': header is not a JSON object", path);
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      MGBENCH_REQUIRE(value.is_object(), DataError, "safetensors '{}': __metadata__ is not an object", path);
      for (const auto& [k, v] : value.items()) out.metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    const std::string where = fmt::format("safetensors '{}' tensor '{}'", path, name);
    try {
      SafetensorsEntry e;
      const std::string dtype = value.at("dtype").get<std::string>();
      const std::size_t element_bytes = safetensors_element_bytes(dtype);
      MGBENCH_REQUIRE(element_bytes != 0, DataError, "{}: unsupported dtype '{}'", where, dtype);
      e.dtype = dtype;
      e.shape = json_integers(value.at("shape"));
      const auto offsets = json_integers(value.at("data_offsets"));
      MGBENCH_REQUIRE(offsets.size() == 2 && 0 <= offsets[0] && offsets[0] <= offsets[1], DataError,
                      "{}: data_offsets must be [begin, end] with 0 <= begin <= end", where);
      e.begin = static_cast<std::size_t>(offsets[0]);
      e.end = static_cast<std::size_t>(offsets[1]);
      std::uint64_t numel = 1;
      bool overflow = false;
      for (const auto d : e.shape) {
        MGBENCH_REQUIRE(d >= 0, DataError, "{}: negative dimension {}", where, d);
        overflow |= __builtin_mul_overflow(numel, static_cast<std::uint64_t>(d), &numel);
      }
      std::uint64_t expected = 0;
      overflow |= __builtin_mul_overflow(numel, static_cast<std::uint64_t>(element_bytes), &expected);
      MGBENCH_REQUIRE(!overflow, DataError, "{}: shape [{}] holds more bytes than 64 bits count", where,
                      fmt::join(e.shape, ", "));
      MGBENCH_REQUIRE(expected == e.end - e.begin, DataError, "{}: shape needs {} bytes of {} but data_offsets span {}",
                      where, expected, dtype, e.end - e.begin);
      MGBENCH_REQUIRE(e.end <= data_bytes, DataError,
                      "{}: data ends at byte {} of a {}-byte data section: the file is truncated", where, e.end,
                      data_bytes);
      out.entries.emplace(name, std::move(e));
    } catch (const nlohmann::json::exception& ex) {
      throw DataError(fmt::format("{}: malformed entry ({})", where, ex.what()));
    }
  }
  // As the reference implementation (safetensors' validate): the tensors tile the data section,
  // in order, without overlaps or holes; an overlap would alias two tensors' bytes.
  std::vector<std::pair<const std::string*, const SafetensorsEntry*>> order;
  for (const auto& [name, e] : out.entries) order.emplace_back(&name, &e);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second->begin != b.second->begin ? a.second->begin < b.second->begin : a.second->end < b.second->end;
  });
  std::size_t end = 0;
  const std::string* previous = nullptr;
  for (const auto& [name, e] : order) {
    MGBENCH_REQUIRE(e->begin >= end, DataError, "safetensors '{}': tensor '{}' (bytes {}-{}) overlaps tensor '{}'",
                    path, *name, e->begin, e->end, previous != nullptr ? *previous : "");
    MGBENCH_REQUIRE(e->begin == end, DataError,
                    "safetensors '{}': a hole of {} bytes before tensor '{}' (the data section must be tiled)", path,
                    e->begin - end, *name);
    end = e->end;
    previous = name;
  }
  // And they end where the file does (safetensors' MetadataIncompleteBuffer): bytes past the last
  // tensor are a file written over a larger one, or something appended.
  MGBENCH_REQUIRE(end == data_bytes, DataError,
                  "safetensors '{}': {} bytes after the last tensor (its data section holds {}, the tensors {}): "
                  "not a whole safetensors file",
                  path, data_bytes - end, data_bytes, end);
  return out;
}

}  // namespace mgbench::models
