#pragma once
// Reading dataset rows from local files in the formats users export from the Hugging Face Hub
// (`datasets.Dataset.to_json / to_csv`, or the raw files): a JSON array of objects (.json),
// JSON Lines (.jsonl), CSV (.csv, RFC 4180, header row) and TSV (.tsv); any of them gzip-compressed
// (.gz, through zlib). Each row becomes a JSON object (CSV/TSV fields as strings).
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mgbench::text {

struct Records {
  std::string path;
  std::vector<nlohmann::json> rows;  // JSON objects
  /// "file.jsonl line 12" / "file.json row 3" / "file.csv row 7 (line 9)": where row i came from.
  std::string where(std::size_t i) const;
  std::vector<std::size_t> lines;  // 1-based source line of each row (0: not tracked, JSON arrays)
};

/// The most text one dataset file may hold, decompressed (a 1 MB .gz can expand to gigabytes):
/// 8 GiB. The text is streamed in 64 KiB pieces -- JSON Lines and CSV a line at a time, a JSON
/// array into its rows -- so memory holds the rows, not the text besides them.
inline constexpr std::size_t kMaxDatasetBytes = std::size_t{8} << 30;

/// Reads every row of path (format by extension, see above). Throws DataError naming the file and
/// the row or line for unreadable files, text beyond kMaxDatasetBytes, malformed JSON / CSV
/// (unterminated quote, a header naming a column twice, a row with more or fewer fields than the
/// header), non-object rows, or invalid UTF-8.
Records read_records(const std::string& path);

/// The string field `name` of row i; throws DataError naming file, row and field when it is
/// missing or not a string (null counts as missing unless allow_null, which returns "").
std::string string_field(const Records& records, std::size_t i, const std::string& name, bool allow_null = false);

}  // namespace mgbench::text
