#include "data/text/records.h"

#include <csv.h>
#include <zlib.h>

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "core/error.h"
#include "core/input_file.h"

namespace mgbench::text {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// The file's bytes, gunzipped when compressed (zlib reads plain files unchanged).
std::string read_all(const std::string& path) {
  require_regular_file(path, "dataset");
  gzFile f = gzopen(path.c_str(), "rb");
  MGBENCH_REQUIRE(f != nullptr, DataError, "dataset '{}': cannot open the file", path);
  std::unique_ptr<gzFile_s, int (*)(gzFile)> closer(f, gzclose);
  std::string data;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) {
    data.append(buf, static_cast<std::size_t>(n));
    // A small .gz can expand to anything: stop at the documented limit instead of exhausting memory.
    MGBENCH_REQUIRE(data.size() <= kMaxDatasetBytes, DataError,
                    "dataset '{}': more than {} GiB of text (decompressed), mgbench's limit for one dataset file: "
                    "split it, or use --limit on a prefix of it",
                    path, kMaxDatasetBytes >> 30);
  }
  int err = 0;
  const char* msg = gzerror(f, &err);
  MGBENCH_REQUIRE(n == 0 && err == Z_OK, DataError, "dataset '{}': read failed ({})", path, msg);
  return data;
}

struct CsvState {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> current;
  std::vector<std::size_t> lines;
};

void csv_field(void* s, std::size_t len, void* data) {
  auto* st = static_cast<CsvState*>(data);
  st->current.emplace_back(s != nullptr ? static_cast<const char*>(s) : "", s != nullptr ? len : 0);
}

void csv_row(int, void* data) {
  auto* st = static_cast<CsvState*>(data);
  st->rows.push_back(std::move(st->current));
  st->current.clear();
}

Records read_delimited(const std::string& path, const std::string& data, unsigned char delimiter) {
  csv_parser parser{};
  MGBENCH_REQUIRE(csv_init(&parser, CSV_STRICT | CSV_STRICT_FINI | CSV_APPEND_NULL) == 0, DataError,
                  "dataset '{}': CSV parser init failed", path);
  csv_set_delim(&parser, delimiter);
  CsvState st;
  // Parse line by line to know where each row starts (for error messages).
  std::size_t line = 1, start = 0;
  std::size_t rows_before = 0;
  while (start < data.size()) {
    std::size_t end = data.find('\n', start);
    end = end == std::string::npos ? data.size() : end + 1;
    if (csv_parse(&parser, data.data() + start, end - start, csv_field, csv_row, &st) != end - start) {
      const std::string why = csv_strerror(csv_error(&parser));
      csv_free(&parser);
      throw DataError(fmt::format("dataset '{}' line {}: malformed CSV ({})", path, line, why));
    }
    for (; rows_before < st.rows.size(); ++rows_before) st.lines.push_back(line);
    ++line;
    start = end;
  }
  if (csv_fini(&parser, csv_field, csv_row, &st) != 0) {
    const std::string why = csv_strerror(csv_error(&parser));
    csv_free(&parser);
    throw DataError(
        fmt::format("dataset '{}': malformed CSV at the end of the file ({}: an unterminated quote?)", path, why));
  }
  csv_free(&parser);
  for (; rows_before < st.rows.size(); ++rows_before) st.lines.push_back(line);
  MGBENCH_REQUIRE(!st.rows.empty(), DataError, "dataset '{}': empty (expected a header row)", path);
  const auto& header = st.rows.front();
  for (std::size_t k = 0; k < header.size(); ++k) {
    for (std::size_t j = 0; j < k; ++j) {
      // A row is a map by column name: a second column of the same name would replace the first.
      MGBENCH_REQUIRE(header[j] != header[k], DataError,
                      "dataset '{}' line {}: the header names column \"{}\" twice (columns {} and {})", path,
                      st.lines.front(), header[k], j + 1, k + 1);
    }
  }
  Records out;
  out.path = path;
  for (std::size_t r = 1; r < st.rows.size(); ++r) {
    const auto& fields = st.rows[r];
    if (fields.size() == 1 && fields[0].empty()) continue;  // blank line
    MGBENCH_REQUIRE(fields.size() == header.size(), DataError,
                    "dataset '{}' row {} (line {}): {} fields, the header has {}", path, r, st.lines[r], fields.size(),
                    header.size());
    nlohmann::json row = nlohmann::json::object();
    for (std::size_t k = 0; k < header.size(); ++k) row[header[k]] = fields[k];
    out.rows.push_back(std::move(row));
    out.lines.push_back(st.lines[r]);
  }
  return out;
}

}  // namespace

std::string Records::where(std::size_t i) const {
  const bool jsonl = ends_with(path, ".jsonl") || ends_with(path, ".jsonl.gz");
  if (i < lines.size() && lines[i] > 0) {
    return jsonl ? fmt::format("dataset '{}' line {}", path, lines[i])
                 : fmt::format("dataset '{}' row {} (line {})", path, i + 1, lines[i]);
  }
  return fmt::format("dataset '{}' row {}", path, i + 1);
}

Records read_records(const std::string& path) {
  std::string name = path;
  if (ends_with(name, ".gz")) name.resize(name.size() - 3);
  const std::string data = read_all(path);
  if (ends_with(name, ".csv")) return read_delimited(path, data, ',');
  if (ends_with(name, ".tsv")) return read_delimited(path, data, '\t');
  Records out;
  out.path = path;
  if (ends_with(name, ".jsonl")) {
    std::size_t line = 0, start = 0;
    while (start < data.size()) {
      std::size_t end = data.find('\n', start);
      if (end == std::string::npos) end = data.size();
      ++line;
      const std::string_view text(data.data() + start, end - start);
      start = end + 1;
      if (text.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      nlohmann::json row;
      try {
        row = nlohmann::json::parse(text);
      } catch (const nlohmann::json::exception& e) {
        throw DataError(fmt::format("dataset '{}' line {}: not valid JSON ({})", path, line, e.what()));
      }
      MGBENCH_REQUIRE(row.is_object(), DataError, "dataset '{}' line {}: expected a JSON object, got {}", path, line,
                      row.type_name());
      out.rows.push_back(std::move(row));
      out.lines.push_back(line);
    }
    return out;
  }
  MGBENCH_REQUIRE(ends_with(name, ".json"), DataError,
                  "dataset '{}': unknown format (expected .json, .jsonl, .csv or .tsv, optionally .gz)", path);
  nlohmann::json all;
  try {
    all = nlohmann::json::parse(data);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(
        fmt::format("dataset '{}': not valid JSON ({}); JSON Lines files must end in .jsonl", path, e.what()));
  }
  MGBENCH_REQUIRE(all.is_array(), DataError, "dataset '{}': expected a JSON array of rows, got {}", path,
                  all.type_name());
  for (std::size_t i = 0; i < all.size(); ++i) {
    MGBENCH_REQUIRE(all[i].is_object(), DataError, "dataset '{}' row {}: expected a JSON object, got {}", path, i + 1,
                    all[i].type_name());
    out.rows.push_back(std::move(all[i]));
  }
  return out;
}

std::string string_field(const Records& records, std::size_t i, const std::string& name, bool allow_null) {
  const nlohmann::json& row = records.rows.at(i);
  const auto it = row.find(name);
  if (it == row.end() || it->is_null()) {
    MGBENCH_REQUIRE(allow_null, DataError, "{}: missing field \"{}\"", records.where(i), name);
    return "";
  }
  MGBENCH_REQUIRE(it->is_string(), DataError, "{}: field \"{}\" is a {}, expected a string", records.where(i), name,
                  it->type_name());
  return it->get<std::string>();
}

}  // namespace mgbench::text
