#pragma once
// The header of a Hugging Face safetensors file (github huggingface/safetensors, format spec in
// its README), parsed and validated without LibTorch: an 8-byte little-endian header length N, N
// bytes of JSON {"<name>": {"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]},
// "__metadata__": {...}}, then the data section, offsets relative to its start.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace mgbench::models {

struct SafetensorsEntry {
  std::string dtype;  // "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8" or "BOOL"
  std::vector<std::int64_t> shape;
  std::size_t begin = 0;  // [begin, end): bytes of the data section
  std::size_t end = 0;
};

struct SafetensorsHeader {
  std::size_t data_offset = 0;  // 8 + N: where the data section starts in the file
  std::map<std::string, SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;  // "__metadata__" (string -> string)
};

/// Bytes per element of a safetensors dtype name; 0 for a name it does not know.
std::size_t safetensors_element_bytes(std::string_view dtype);

/// Parses the header of `file` (the whole file's bytes; only the header is read) and validates
/// it as the reference implementation does: header length within the file and <= 100 MiB, JSON
/// object, known dtypes, non-negative dimensions whose byte count fits 64 bits and equals the
/// data_offsets span, offsets inside the data section, and tensors tiling the data section in
/// order (no overlap, no hole). Throws DataError naming `path` (and the tensor).
SafetensorsHeader parse_safetensors_header(std::string_view file, const std::string& path);
/// The same for a file read in part: `head` holds at least its first 8 + N bytes (the length and
/// the JSON; a shorter head is refused as a truncated header), file_size is the whole file's bytes.
SafetensorsHeader parse_safetensors_header(std::string_view head, std::uint64_t file_size, const std::string& path);

}  // namespace mgbench::models
