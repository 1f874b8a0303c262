#include "data/text/tiktoken.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <charconv>
#include <fstream>
#include <functional>
#include <limits>
#include <queue>
#include <stdexcept>

#include <fmt/format.h>

#include "core/error.h"
#include "core/input_file.h"

namespace mgbench::text {
namespace {

/// A field quoted in an error: whole up to 80 characters, else its first 80 and its length (a
/// broken line can be megabytes long).
std::string excerpt(std::string_view field) {
  constexpr std::size_t kMax = 80;
  if (field.size() <= kMax) return fmt::format("'{}'", field);
  return fmt::format("'{}...' ({} characters)", field.substr(0, kMax), field.size());
}

/// RFC 4648 base64 (with padding), as tiktoken files use it. Returns false on any invalid input.
bool decode_base64(std::string_view in, std::string& out) {
  static const std::array<std::int8_t, 256> table = [] {
    std::array<std::int8_t, 256> t{};
    t.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(alphabet[i])] = static_cast<std::int8_t>(i);
    return t;
  }();
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  for (std::size_t i = 0; i < in.size(); i += 4) {
    std::uint32_t v = 0;
    int pad = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      const char c = in[i + k];
      if (c == '=') {
        if (i + 4 != in.size() || k < 2) return false;
        ++pad;
        v <<= 6;
        continue;
      }
      if (pad > 0) return false;
      const int d = table[static_cast<unsigned char>(c)];
      if (d < 0) return false;
      v = (v << 6) | static_cast<std::uint32_t>(d);
    }
    out.push_back(static_cast<char>((v >> 16) & 0xFF));
    if (pad < 2) out.push_back(static_cast<char>((v >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(v & 0xFF));
  }
  return true;
}

constexpr std::int32_t kNoRank = std::numeric_limits<std::int32_t>::max();

}  // namespace

struct TiktokenBpe::Regex {
  pcre2_code* code = nullptr;
  ~Regex() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

namespace {
/// Per-thread JIT stack (PCRE2's default 32 KiB overflows on long whitespace runs) and match context.
struct JitContext {
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  JitContext() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~JitContext() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};
pcre2_match_context* thread_match_context() {
  thread_local JitContext jit;
  return jit.context;
}
}  // namespace

TiktokenBpe::TiktokenBpe(const std::string& path, const std::string& pattern) : regex_(std::make_unique<Regex>()) {
  require_regular_file(path, "tokenizer");
  std::ifstream in(path, std::ios::binary);
  MGBENCH_REQUIRE(in.good(), DataError, "tokenizer '{}': cannot open the file", path);
  std::string line, bytes;
  std::int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const auto space = line.find(' ');
    MGBENCH_REQUIRE(space != std::string::npos, DataError,
                    "tokenizer '{}' line {}: expected '<base64 token> <rank>', got no rank", path, line_no);
    std::int32_t rank = -1;
    const char* first = line.data() + space + 1;
    const char* last = line.data() + line.size();
    const auto [end, ec] = std::from_chars(first, last, rank);
    MGBENCH_REQUIRE(ec == std::errc() && end == last && rank >= 0, DataError,
                    "tokenizer '{}' line {}: rank {} is not a non-negative integer", path, line_no,
                    excerpt(std::string_view(first, static_cast<std::size_t>(last - first))));
    MGBENCH_REQUIRE(decode_base64(std::string_view(line).substr(0, space), bytes), DataError,
                    "tokenizer '{}' line {}: {} is not valid base64", path, line_no,
                    excerpt(std::string_view(line).substr(0, space)));
    MGBENCH_REQUIRE(rank == static_cast<std::int32_t>(decoder_.size()), DataError,
                    "tokenizer '{}' line {}: rank {} out of order (expected {}: ranks are 0, 1, 2, ...)", path, line_no,
                    rank, decoder_.size());
    MGBENCH_REQUIRE(encoder_.emplace(bytes, rank).second, DataError, "tokenizer '{}' line {}: token repeated", path,
                    line_no);
    decoder_.push_back(bytes);
  }
  MGBENCH_REQUIRE(!decoder_.empty(), DataError, "tokenizer '{}': no tokens (expected tiktoken lines '<base64> <rank>')",
                  path);
  vocab_size_ = base_vocab_size();

  int error = 0;
  PCRE2_SIZE offset = 0;
  regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), PCRE2_ZERO_TERMINATED,
                               PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (regex_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw ConfigError(
        fmt::format("tokenizer pattern: {} at offset {}", reinterpret_cast<const char*>(message), offset));
  }
  pcre2_jit_compile(regex_->code, PCRE2_JIT_COMPLETE);  // optional speed-up; falls back to the interpreter
}

TiktokenBpe::~TiktokenBpe() = default;

void TiktokenBpe::add_special_tokens(const std::vector<std::pair<std::string, std::int32_t>>& specials) {
  for (const auto& [name, id] : specials) {
    MGBENCH_REQUIRE(id >= base_vocab_size(), ConfigError, "special token {} = {} collides with the file's ranks (< {})",
                    name, id, base_vocab_size());
    special_names_[id] = name;
    specials_[name] = id;
    vocab_size_ = std::max(vocab_size_, id + 1);
  }
}

std::int32_t TiktokenBpe::rank_of(std::string_view bytes) const {
  const auto it = encoder_.find(bytes);
  return it == encoder_.end() ? kNoRank : it->second;
}

void TiktokenBpe::encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const {
  if (const std::int32_t whole = rank_of(piece); whole != kNoRank) {
    out.push_back(whole);
    return;
  }
  if (piece.size() >= kHeapMergeMinBytes) {
    encode_long_piece(piece, out);
    return;
  }
  // tiktoken's _byte_pair_merge: parts[i] = (start offset, rank of the pair starting there).
  struct Part {
    std::size_t start;
    std::int32_t rank;
  };
  std::vector<Part> parts;
  parts.reserve(piece.size() + 1);
  for (std::size_t i = 0; i + 1 < piece.size(); ++i) parts.push_back({i, rank_of(piece.substr(i, 2))});
  parts.push_back({piece.size() - 1, kNoRank});
  parts.push_back({piece.size(), kNoRank});
  auto pair_rank = [&](std::size_t i) {  // rank of parts[i] .. parts[i + 2] joined
    if (i + 3 < parts.size()) return rank_of(piece.substr(parts[i].start, parts[i + 3].start - parts[i].start));
    return kNoRank;
  };
  while (parts.size() > 1) {
    std::int32_t best = kNoRank;
    std::size_t at = 0;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      if (parts[i].rank < best) {
        best = parts[i].rank;
        at = i;
      }
    }
    if (best == kNoRank) break;
    parts[at].rank = pair_rank(at);
    if (at > 0) parts[at - 1].rank = pair_rank(at - 1);
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    emit_part(piece.substr(parts[i].start, parts[i + 1].start - parts[i].start), out);
  }
}

void TiktokenBpe::emit_part(std::string_view part, std::vector<std::int32_t>& out) const {
  const std::int32_t r = rank_of(part);
  // Every single byte is a token in a byte-level BPE file; a file without one cannot encode it.
  MGBENCH_REQUIRE(r != kNoRank, DataError,
                  "tokenizer: byte sequence of length {} has no token (the file lacks single-byte tokens)",
                  part.size());
  out.push_back(r);
}

void TiktokenBpe::encode_long_piece(std::string_view piece, std::vector<std::int32_t>& out) const {
  // Part i spans [i, next[i]): a part keeps its first byte's index when it absorbs its right
  // neighbour, so indices order parts as positions do and "leftmost" is "smallest index".
  const std::size_t n = piece.size();
  std::vector<std::size_t> next(n), prev(n);
  std::vector<std::uint32_t> version(n, 0);
  for (std::size_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i == 0 ? n : i - 1;  // n: none
  }
  struct Candidate {
    std::int32_t rank;
    std::size_t start;
    std::uint32_t version;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : start > o.start; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  // The rank of part i joined with its right neighbour (kNoRank without one or without a token).
  auto pair_rank = [&](std::size_t i) {
    const std::size_t j = next[i];
    if (j >= n) return kNoRank;
    return rank_of(piece.substr(i, next[j] - i));
  };
  auto offer = [&](std::size_t i) {
    ++version[i];
    if (const std::int32_t r = pair_rank(i); r != kNoRank) heap.push({r, i, version[i]});
  };
  for (std::size_t i = 0; i + 1 < n; ++i) offer(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (c.version != version[c.start]) continue;  // stale: the part or its neighbour changed since
    const std::size_t i = c.start;
    const std::size_t j = next[i];  // absorbed
    next[i] = next[j];
    if (next[j] < n) prev[next[j]] = i;
    ++version[j];  // j is gone: its candidates are stale
    offer(i);
    if (prev[i] < n) offer(prev[i]);
  }
  for (std::size_t i = 0; i < n; i = next[i]) emit_part(piece.substr(i, next[i] - i), out);
}

std::vector<std::int32_t> TiktokenBpe::encode(std::string_view text) const {
  std::vector<std::int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(regex_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE offset = 0;
  std::uint32_t options = 0;
  try {
    while (offset < text.size()) {
      const int rc = pcre2_match(regex_->code, subject, text.size(), offset, options, match, thread_match_context());
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof(message));
        // For UTF-8 errors pcre2_get_startchar() is the offset of the invalid character.
        throw DataError(fmt::format("tokenizer: input text at byte {}: {}", pcre2_get_startchar(match),
                                    reinterpret_cast<const char*>(message)));
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
      if (ovector[1] == ovector[0]) {  // the pattern cannot match empty; guard against a custom one
        ++offset;
        continue;
      }
      encode_piece(text.substr(ovector[0], ovector[1] - ovector[0]), ids);
      offset = ovector[1];
      options = PCRE2_NO_UTF_CHECK;  // the whole subject was checked by the first match
    }
  } catch (...) {
    pcre2_match_data_free(match);
    throw;
  }
  pcre2_match_data_free(match);
  return ids;
}

std::string TiktokenBpe::decode(const std::vector<std::int32_t>& ids) const {
  std::string out;
  for (const std::int32_t id : ids) {
    if (id >= 0 && id < base_vocab_size()) {
      out += decoder_[static_cast<std::size_t>(id)];
    } else if (auto it = special_names_.find(id); it != special_names_.end()) {
      out += it->second;
    } else {
      throw std::out_of_range(
          fmt::format("tokenizer: token id {} is outside the vocabulary (size {})", id, vocab_size_));
    }
  }
  return out;
}

std::int32_t TiktokenBpe::special(const std::string& name) const {
  const auto it = specials_.find(name);
  if (it == specials_.end()) throw std::out_of_range("tokenizer: no special token " + name);
  return it->second;
}

}  // namespace mgbench::text
