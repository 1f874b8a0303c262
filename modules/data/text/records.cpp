#include "data/text/records.h"

#include <csv.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <istream>
#include <memory>
#include <streambuf>

#include <fmt/format.h>

#include "core/error.h"
#include "core/input_file.h"

namespace mgbench::text {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// The file's text as a stream, gunzipped when compressed (zlib reads plain files unchanged), read
/// in 64 KiB pieces: the parsers below hold one line (JSONL, CSV) or the rows they made (JSON),
/// never the whole text. Throws DataError from underflow past kMaxDatasetBytes or on a read error
/// (through nlohmann's parser, which reads the buffer directly, and through std::getline, whose
/// stream rethrows with badbit in its exception mask).
class GzText final : public std::streambuf {
 public:
  explicit GzText(const std::string& path) : path_(path) {
    require_regular_file(path, "dataset");
    file_ = gzopen(path.c_str(), "rb");
    MGBENCH_REQUIRE(file_ != nullptr, DataError, "dataset '{}': cannot open the file", path);
  }
  ~GzText() override { gzclose(file_); }
  GzText(const GzText&) = delete;
  GzText& operator=(const GzText&) = delete;

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    const std::size_t n = gz_read(file_, buffer_.data(), static_cast<unsigned>(buffer_.size()), path_, "dataset");
    if (n == 0) return traits_type::eof();
    total_ += n;
    // A small .gz can expand to anything: stop at the documented limit instead of exhausting memory.
    MGBENCH_REQUIRE(total_ <= kMaxDatasetBytes, DataError,
                    "dataset '{}': more than {} GiB of text (decompressed), mgbench's limit for one dataset file: "
                    "split it, or use --limit on a prefix of it",
                    path_, kMaxDatasetBytes >> 30);
    setg(buffer_.data(), buffer_.data(), buffer_.data() + n);
    return traits_type::to_int_type(*gptr());
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
  std::array<char, 1 << 16> buffer_{};
  std::size_t total_ = 0;
};

/// Lines of a GzText ('\n' removed), with their 1-based numbers. A UTF-8 byte-order mark opening the
/// file (Excel's "CSV UTF-8", Notepad) is dropped, as Python's utf-8-sig and pandas drop it: a CSV's
/// first column's name held it (nlohmann's JSON parser skips it itself).
class Lines {
 public:
  explicit Lines(const std::string& path) : text_(path), in_(&text_) { in_.exceptions(std::ios::badbit); }
  bool next(std::string& line) {
    if (!std::getline(in_, line)) return false;
    if (++number_ == 1 && line.starts_with("\xEF\xBB\xBF")) line.erase(0, 3);
    return true;
  }
  std::size_t number() const { return number_; }

 private:
  GzText text_;
  std::istream in_;
  std::size_t number_ = 0;
};

/// libcsv's callbacks (C: they must not throw) build the rows as they complete: the header, then
/// one JSON object per row, or the first problem, reported after csv_parse returns.
struct CsvState {
  std::vector<std::string> header;
  bool have_header = false;
  std::vector<std::string> current;
  bool current_unquoted_empty = false;  // the row's first field was empty and unquoted (CSV_EMPTY_IS_NULL)
  std::size_t line = 0;
  std::size_t header_line = 0;
  std::size_t row = 0;  // data rows seen
  std::string problem;
  Records* out = nullptr;
};

void csv_field(void* s, std::size_t len, void* data) {
  auto* st = static_cast<CsvState*>(data);
  if (st->current.empty()) st->current_unquoted_empty = s == nullptr;
  st->current.emplace_back(s != nullptr ? static_cast<const char*>(s) : "", s != nullptr ? len : 0);
}

void csv_row(int, void* data) {
  auto* st = static_cast<CsvState*>(data);
  std::vector<std::string> fields = std::move(st->current);
  st->current.clear();
  if (!st->problem.empty()) return;
  if (!st->have_header) {
    st->header = std::move(fields);
    st->have_header = true;
    st->header_line = st->line;
    return;
  }
  ++st->row;
  // A blank line; a quoted empty value ("") is a row, as pandas and HF datasets read it (was dropped).
  if (fields.size() == 1 && st->current_unquoted_empty) return;
  if (fields.size() != st->header.size()) {
    st->problem = fmt::format("dataset '{}' row {} (line {}): {} fields, the header has {}", st->out->path, st->row,
                              st->line, fields.size(), st->header.size());
    return;
  }
  nlohmann::json row = nlohmann::json::object();
  for (std::size_t k = 0; k < st->header.size(); ++k) row[st->header[k]] = std::move(fields[k]);
  st->out->rows.push_back(std::move(row));
  st->out->lines.push_back(st->line);
}

void check_header(const CsvState& st) {
  const auto& header = st.header;
  for (std::size_t k = 0; k < header.size(); ++k) {
    for (std::size_t j = 0; j < k; ++j) {
      // A row is a map by column name: a second column of the same name would replace the first.
      MGBENCH_REQUIRE(header[j] != header[k], DataError,
                      "dataset '{}' line {}: the header names column \"{}\" twice (columns {} and {})", st.out->path,
                      st.header_line, header[k], j + 1, k + 1);
    }
  }
}

Records read_delimited(const std::string& path, unsigned char delimiter) {
  Records out;
  out.path = path;
  csv_parser parser{};
  MGBENCH_REQUIRE(csv_init(&parser, CSV_STRICT | CSV_STRICT_FINI | CSV_APPEND_NULL | CSV_EMPTY_IS_NULL) == 0, DataError,
                  "dataset '{}': CSV parser init failed", path);
  std::unique_ptr<csv_parser, void (*)(csv_parser*)> freer(&parser, csv_free);
  csv_set_delim(&parser, delimiter);
  CsvState st;
  st.out = &out;
  // Line by line, to know where each row ends (for error messages); a quoted field may span lines.
  Lines lines(path);
  std::string line;
  while (lines.next(line)) {
    line += '\n';
    st.line = lines.number();
    if (csv_parse(&parser, line.data(), line.size(), csv_field, csv_row, &st) != line.size()) {
      throw DataError(fmt::format("dataset '{}' line {}: malformed CSV ({})", path, lines.number(),
                                  csv_strerror(csv_error(&parser))));
    }
    if (st.have_header && st.header_line == st.line) check_header(st);
    MGBENCH_REQUIRE(st.problem.empty(), DataError, "{}", st.problem);
  }
  st.line = lines.number();
  if (csv_fini(&parser, csv_field, csv_row, &st) != 0) {
    throw DataError(fmt::format("dataset '{}': malformed CSV at the end of the file ({}: an unterminated quote?)", path,
                                csv_strerror(csv_error(&parser))));
  }
  MGBENCH_REQUIRE(st.have_header, DataError, "dataset '{}': empty (expected a header row)", path);
  check_header(st);
  MGBENCH_REQUIRE(st.problem.empty(), DataError, "{}", st.problem);
  return out;
}

Records read_json_lines(const std::string& path) {
  Records out;
  out.path = path;
  Lines lines(path);
  std::string text;
  while (lines.next(text)) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(fmt::format("dataset '{}' line {}: not valid JSON ({})", path, lines.number(), e.what()));
    }
    MGBENCH_REQUIRE(row.is_object(), DataError, "dataset '{}' line {}: expected a JSON object, got {}", path,
                    lines.number(), row.type_name());
    out.rows.push_back(std::move(row));
    out.lines.push_back(lines.number());
  }
  return out;
}

Records read_json_array(const std::string& path) {
  Records out;
  out.path = path;
  GzText text(path);
  std::istream in(&text);
  nlohmann::json all;
  try {
    all = nlohmann::json::parse(in);
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
  if (ends_with(name, ".csv")) return read_delimited(path, ',');
  if (ends_with(name, ".tsv")) return read_delimited(path, '\t');
  if (ends_with(name, ".jsonl")) return read_json_lines(path);
  MGBENCH_REQUIRE(ends_with(name, ".json"), DataError,
                  "dataset '{}': unknown format (expected .json, .jsonl, .csv or .tsv, optionally .gz)", path);
  return read_json_array(path);
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
