#include "data/text/llama3_tokenizer.h"

#include <fmt/format.h>

#include "core/error.h"

namespace mgbench::text {
std::vector<std::pair<std::string, std::int32_t>> Llama3Tokenizer::special_tokens(std::int32_t base) {
  // Meta's Llama 3.1 names by offset from the base vocabulary; reserved tokens fill the rest.
  static const char* const kNamed[] = {"<|begin_of_text|>",
                                       "<|end_of_text|>",
                                       "<|reserved_special_token_0|>",
                                       "<|reserved_special_token_1|>",
                                       "<|finetune_right_pad_id|>",
                                       "<|reserved_special_token_2|>",
                                       "<|start_header_id|>",
                                       "<|end_header_id|>",
                                       "<|eom_id|>",
                                       "<|eot_id|>",
                                       "<|python_tag|>"};
  std::vector<std::pair<std::string, std::int32_t>> out;
  std::int32_t offset = 0;
  for (const char* name : kNamed) out.emplace_back(name, base + offset++);
  for (int reserved = 3; offset < kNumSpecial; ++reserved) {
    out.emplace_back(fmt::format("<|reserved_special_token_{}|>", reserved), base + offset++);
  }
  return out;
}

Llama3Tokenizer::Llama3Tokenizer(const std::string& path) : bpe_(path, kLlama3Pattern) {
  bpe_.add_special_tokens(special_tokens(bpe_.base_vocab_size()));
  bos_ = bpe_.special("<|begin_of_text|>");
  eos_ = bpe_.special("<|end_of_text|>");
  pad_ = bpe_.special("<|finetune_right_pad_id|>");
  start_header_ = bpe_.special("<|start_header_id|>");
  end_header_ = bpe_.special("<|end_header_id|>");
  eot_ = bpe_.special("<|eot_id|>");
}

std::vector<std::int32_t> Llama3Tokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  std::vector<std::int32_t> ids;
  if (add_bos) ids.push_back(bos_);
  const std::vector<std::int32_t> body = bpe_.encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  if (add_eos) ids.push_back(eos_);
  return ids;
}

}  // namespace mgbench::text
