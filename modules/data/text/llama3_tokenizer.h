#pragma once
// The Llama 3 tokenizer: tiktoken BPE from Meta's `tokenizer.model` (128,000 ranks), Llama 3's
// pre-tokenisation pattern and its 256 special tokens (ids 128000-128255, the names of Meta's
// Llama 3.1 tokenizer: <|begin_of_text|> 128000, <|end_of_text|> 128001, <|finetune_right_pad_id|>
// 128004, <|start_header_id|> 128006, <|end_header_id|> 128007, <|eom_id|> 128008, <|eot_id|>
// 128009, <|python_tag|> 128010, <|reserved_special_token_N|> for the rest).
// Follows TorchTune's Llama3Tokenizer (torchtune/models/llama3/_tokenizer.py) for encode().
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/text/tiktoken.h"

namespace mgbench::text {

class Llama3Tokenizer {
 public:
  static constexpr std::int32_t kBaseVocab = 128000;
  static constexpr std::int32_t kNumSpecial = 256;

  /// path: a tiktoken file (Meta's tokenizer.model or a smaller one, e.g. TorchTune's
  /// tiktoken_small.model). The special tokens follow the file's last rank when the file is
  /// smaller than 128,000 tokens. Throws DataError naming the file for an unreadable one.
  explicit Llama3Tokenizer(const std::string& path);

  /// Ids of UTF-8 text, with <|begin_of_text|> / <|end_of_text|> when asked. Special-token text
  /// in the input is encoded as ordinary text (as TorchTune does). Throws DataError for invalid UTF-8.
  std::vector<std::int32_t> encode(std::string_view text, bool add_bos, bool add_eos) const;
  std::string decode(const std::vector<std::int32_t>& ids) const { return bpe_.decode(ids); }

  std::int32_t bos_id() const { return bos_; }
  std::int32_t eos_id() const { return eos_; }
  std::int32_t pad_id() const { return pad_; }
  std::int32_t start_header_id() const { return start_header_; }
  std::int32_t end_header_id() const { return end_header_; }
  std::int32_t eot_id() const { return eot_; }
  std::int32_t vocab_size() const { return bpe_.vocab_size(); }
  const TiktokenBpe& bpe() const { return bpe_; }

  /// The special tokens for a base vocabulary of `base` ranks: (name, id) in id order.
  static std::vector<std::pair<std::string, std::int32_t>> special_tokens(std::int32_t base);

 private:
  TiktokenBpe bpe_;
  std::int32_t bos_ = 0, eos_ = 0, pad_ = 0, start_header_ = 0, end_header_ = 0, eot_ = 0;
};

}  // namespace mgbench::text
