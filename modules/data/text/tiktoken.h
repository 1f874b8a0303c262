#pragma once
// Byte-level BPE with tiktoken's file format and algorithm (github openai/tiktoken, src/lib.rs):
// the text is split into pieces by a pre-tokenisation regex (PCRE2, Unicode properties), each
// piece is looked up whole, else merged from single bytes by repeatedly joining the adjacent pair
// of lowest rank. Special tokens are ids beyond the file's ranks; encode() treats their text as
// ordinary text (TorchTune's TikTokenBaseTokenizer: allowed_special = none, disallowed = none),
// templates insert them by id.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mgbench::text {

/// Hash / equality for string-keyed maps searched with string_view (no allocation per lookup).
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

class TiktokenBpe {
 public:
  /// Pieces at least this long are merged with the heap (shorter: tiktoken's linear scan, faster
  /// there). A 1 MB piece without spaces (DNA, base64) took minutes with the scan alone.
  static constexpr std::size_t kHeapMergeMinBytes = 128;

  /// Reads a tiktoken BPE file: one `<base64 bytes> <rank>` line per token, ranks 0, 1, 2, ...
  /// pattern: the pre-tokenisation regex (PCRE2 syntax, compiled with UTF and UCP). Throws
  /// DataError naming the file and line for a bad line (bad base64, missing, non-numeric or
  /// out-of-order rank, repeated token) and ConfigError for a bad pattern.
  TiktokenBpe(const std::string& path, const std::string& pattern);
  /// Registers special tokens (name, id), ids at or above base_vocab_size(). Throws ConfigError
  /// for an id inside the file's ranks.
  void add_special_tokens(const std::vector<std::pair<std::string, std::int32_t>>& specials);
  ~TiktokenBpe();
  TiktokenBpe(const TiktokenBpe&) = delete;
  TiktokenBpe& operator=(const TiktokenBpe&) = delete;

  /// Token ids of UTF-8 text (no BOS/EOS). Throws DataError for invalid UTF-8 (with its byte offset).
  std::vector<std::int32_t> encode(std::string_view text) const;
  /// Bytes of the ids (special ids give their names). Throws std::out_of_range for an unknown id.
  std::string decode(const std::vector<std::int32_t>& ids) const;

  /// Id of a special token name; throws std::out_of_range when unknown.
  std::int32_t special(const std::string& name) const;
  /// Ranks in the file (the base vocabulary).
  std::int32_t base_vocab_size() const { return static_cast<std::int32_t>(decoder_.size()); }
  /// Base vocabulary plus special tokens: one past the largest id.
  std::int32_t vocab_size() const { return vocab_size_; }

 private:
  void encode_piece(std::string_view piece, std::vector<std::int32_t>& out) const;
  /// The same merges for long pieces in O(n log n): a heap of candidate pairs (rank, then start:
  /// tiktoken's lowest rank, leftmost on ties) over a linked list of parts, stale entries skipped.
  void encode_long_piece(std::string_view piece, std::vector<std::int32_t>& out) const;
  /// Appends the token of every part of a merged piece; throws DataError for a part without one.
  void emit_part(std::string_view part, std::vector<std::int32_t>& out) const;
  std::int32_t rank_of(std::string_view bytes) const;

  std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>> encoder_;
  std::vector<std::string> decoder_;  // rank -> bytes
  std::unordered_map<std::string, std::int32_t> specials_;
  std::unordered_map<std::int32_t, std::string> special_names_;
  std::int32_t vocab_size_ = 0;
  struct Regex;
  std::unique_ptr<Regex> regex_;
};

/// Llama 3's pre-tokenisation pattern (tiktoken's cl100k_base pattern, as Meta and TorchTune use it).
inline constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace mgbench::text
