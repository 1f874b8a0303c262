#include "data/text/sft.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/option_table.h"

namespace mgbench::text {
namespace {

constexpr const char* kAlpacaWithInput =
    "Below is an instruction that describes a task, paired with an input that provides further context. Write a "
    "response that appropriately completes the request.\n\n### Instruction:\n{}\n\n### Input:\n{}\n\n### Response:\n";
constexpr const char* kAlpacaNoInput =
    "Below is an instruction that describes a task. Write a response that appropriately completes the "
    "request.\n\n### Instruction:\n{}\n\n### Response:\n";

/// Python's str.strip(): removes leading and trailing whitespace (ASCII and the Unicode spaces
/// that occur in text data).
std::string strip(const std::string& s) {
  auto is_space_at = [&](std::size_t i, std::size_t& len) {
    const auto c = static_cast<unsigned char>(s[i]);
    len = 1;
    if (c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f)) return true;
    // U+0085, U+00A0 (2 bytes), U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000 (3 bytes)
    if (c == 0xC2 && i + 1 < s.size() &&
        (static_cast<unsigned char>(s[i + 1]) == 0x85 || static_cast<unsigned char>(s[i + 1]) == 0xA0)) {
      len = 2;
      return true;
    }
    if (i + 2 < s.size()) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      const auto c2 = static_cast<unsigned char>(s[i + 2]);
      len = 3;
      if (c == 0xE1 && c1 == 0x9A && c2 == 0x80) return true;
      if (c == 0xE2 && c1 == 0x80 && ((c2 >= 0x80 && c2 <= 0x8A) || c2 == 0xA8 || c2 == 0xA9 || c2 == 0xAF))
        return true;
      if (c == 0xE2 && c1 == 0x81 && c2 == 0x9F) return true;
      if (c == 0xE3 && c1 == 0x80 && c2 == 0x80) return true;
    }
    return false;
  };
  std::size_t begin = 0, len = 0;
  while (begin < s.size() && is_space_at(begin, len)) begin += len;
  std::size_t end = s.size();
  while (end > begin) {
    // Step back over one UTF-8 character.
    std::size_t k = end - 1;
    while (k > begin && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    if (!is_space_at(k, len) || k + len != end) break;
    end = k;
  }
  return s.substr(begin, end - begin);
}

/// TorchTune's truncate(): keep the first n, make the last one `last` when it is not already.
template <class T>
void truncate(std::vector<T>& v, std::size_t n, const T& last) {
  if (v.size() > n) v.resize(n);
  if (!v.empty() && v.back() != last) v.back() = last;
}

std::vector<Message> alpaca_messages(const Records& records, std::size_t i, bool user_masked) {
  const std::string instruction = string_field(records, i, "instruction");
  const std::string input = string_field(records, i, "input", /*allow_null=*/true);
  const std::string prompt = input.empty() ? fmt::format(fmt::runtime(kAlpacaNoInput), instruction)
                                           : fmt::format(fmt::runtime(kAlpacaWithInput), instruction, input);
  return {{"user", {prompt}, user_masked}, {"assistant", {string_field(records, i, "output")}, false}};
}

std::vector<Message> grammar_messages(const Records& records, std::size_t i, bool user_masked) {
  // C4_200M on the Hub has input/output; some exports name the output `target`.
  const auto& row = records.rows[i];
  const std::string output_field = row.contains("output") || !row.contains("target") ? "output" : "target";
  return {{"user",
           {"Correct this to standard English: ", string_field(records, i, "input"), "\n---\nCorrected: "},
           user_masked},
          {"assistant", {string_field(records, i, output_field)}, false}};
}

std::vector<Message> samsum_messages(const Records& records, std::size_t i, bool user_masked) {
  return {
      {"user", {"Summarize this dialogue:\n", string_field(records, i, "dialogue"), "\n---\nSummary:\n"}, user_masked},
      {"assistant", {string_field(records, i, "summary")}, false}};
}

// clang-format off
constexpr DatasetInfo kDatasets[] = {
    {"alpaca", DatasetKind::kAlpaca, "instruction / input / output (alpaca-cleaned; TorchTune's alpaca_dataset)",
     &alpaca_messages},
    {"grammar", DatasetKind::kGrammar, "input / output (C4 200M grammar; TorchTune's grammar_dataset)",
     &grammar_messages},
    {"samsum", DatasetKind::kSamsum, "dialogue / summary (SAMSum; TorchTune's samsum_dataset)", &samsum_messages},
    {"slimorca", DatasetKind::kSlimOrca, "ShareGPT conversations (SlimOrca-Dedup; TorchTune's slimorca_dataset)",
     &sharegpt_conversation},
    {"text", DatasetKind::kText, "the `text` field, loss on every token (TorchTune's text_completion_dataset)",
     nullptr},
};
// clang-format on

}  // namespace

std::span<const DatasetInfo> dataset_choices() { return kDatasets; }

void validate_messages(const std::vector<Message>& messages) {
  MGBENCH_REQUIRE(messages.size() >= 2, DataError,
                  "{} message(s): expected a conversation of at least a user and an assistant turn", messages.size());
  std::string_view last = "assistant";
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    MGBENCH_REQUIRE(role != "assistant" || last == "user", DataError,
                    "turn {}: an assistant turn where a user turn was expected (turns alternate, user first)", i + 1);
    MGBENCH_REQUIRE(role != "user" || last != "user", DataError, "turns {} and {}: two user turns in a row", i, i + 1);
    MGBENCH_REQUIRE(role != "system" || i == 0, DataError, "turn {}: a system turn after the first", i + 1);
    last = role;
  }
}

Message sharegpt_turn(const Records& records, std::size_t i, const nlohmann::json& turn, const std::string& where,
                      bool user_masked) {
  MGBENCH_REQUIRE(turn.is_object() && turn.contains("from") && turn.contains("value") && turn["from"].is_string() &&
                      turn["value"].is_string(),
                  DataError, "{}: {} needs string fields \"from\" and \"value\"", records.where(i), where);
  const std::string from = turn["from"].get<std::string>();
  const std::string role = from == "system" ? "system" : from == "human" ? "user" : from == "gpt" ? "assistant" : "";
  MGBENCH_REQUIRE(!role.empty(), DataError, "{}: {}: \"from\": \"{}\", expected system, human or gpt", records.where(i),
                  where, from);
  // TorchTune 0.6.1 (ShareGPTToMessages): every non-assistant turn masked unless training on input.
  return {role, {turn["value"].get<std::string>()}, role != "assistant" && user_masked};
}

std::vector<Message> sharegpt_conversation(const Records& records, std::size_t i, bool user_masked) {
  const auto& row = records.rows[i];
  MGBENCH_REQUIRE(row.contains("conversations") && row["conversations"].is_array(), DataError,
                  "{}: missing field \"conversations\" (a list of {{from, value}} turns)", records.where(i));
  std::vector<Message> messages;
  std::size_t turn = 0;
  for (const auto& t : row["conversations"]) {
    messages.push_back(sharegpt_turn(records, i, t, fmt::format("conversation turn {}", ++turn), user_masked));
  }
  return messages;
}

TokenizedSample tokenize_messages(const std::vector<Message>& messages, const Llama3Tokenizer& tok,
                                  std::int64_t max_seq_len) {
  std::vector<std::int32_t> tokens{tok.bos_id()};
  std::vector<bool> mask{true};
  const auto nl = tok.encode("\n\n", false, false);
  for (const auto& m : messages) {
    std::vector<std::int32_t> piece{tok.start_header_id()};
    for (auto id : tok.encode(strip(m.role), false, false)) piece.push_back(id);
    piece.push_back(tok.end_header_id());
    piece.insert(piece.end(), nl.begin(), nl.end());
    for (const auto& text : m.content) {
      for (auto id : tok.encode(strip(text), false, false)) piece.push_back(id);
    }
    piece.push_back(tok.eot_id());
    tokens.insert(tokens.end(), piece.begin(), piece.end());
    mask.insert(mask.end(), piece.size(), m.masked);
    if (max_seq_len > 0 && static_cast<std::int64_t>(tokens.size()) >= max_seq_len) break;
  }
  tokens.push_back(tok.eos_id());
  mask.push_back(true);
  TokenizedSample s;
  if (max_seq_len > 0) {
    s.truncated = static_cast<std::int64_t>(tokens.size()) > max_seq_len;  // a break above: past it too
    truncate(tokens, static_cast<std::size_t>(max_seq_len), tok.eos_id());
    truncate(mask, static_cast<std::size_t>(max_seq_len), true);
  }
  s.tokens = tokens;
  s.labels.resize(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) s.labels[i] = mask[i] ? kIgnoreIndex : tokens[i];
  return s;
}

TokenizedSample make_sample(const Records& records, std::size_t i, const Llama3Tokenizer& tok,
                            const SftOptions& options) {
  try {
    const DatasetInfo& dataset = mgbench::options::row_of(dataset_choices(), options.kind);
    if (dataset.messages == nullptr) {  // plain text
      TokenizedSample s;
      s.tokens = tok.encode(string_field(records, i, "text"), true, true);
      if (options.max_seq_len > 0 && static_cast<std::int64_t>(s.tokens.size()) > options.max_seq_len - 1) {
        s.tokens.resize(static_cast<std::size_t>(
            std::max<std::int64_t>(options.max_seq_len - 1, 0)));  // TorchTune: no EOS coercion
        s.truncated = true;
      }
      s.labels = s.tokens;
      return s;
    }
    const std::vector<Message> messages = dataset.messages(records, i, /*user_masked=*/!options.train_on_input);
    validate_messages(messages);
    return tokenize_messages(messages, tok, options.max_seq_len);
  } catch (const DataError& e) {
    const std::string where = records.where(i);
    if (std::string(e.what()).find(records.path) != std::string::npos) throw;
    throw DataError(fmt::format("{}: {}", where, e.what()));
  }
}

std::vector<TokenizedSample> load_sft_dataset(const std::string& path, const Llama3Tokenizer& tokenizer,
                                              const SftOptions& options) {
  const Records records = read_records(path);
  std::vector<TokenizedSample> samples;
  samples.reserve(records.rows.size());
  for (std::size_t i = 0; i < records.rows.size(); ++i) samples.push_back(make_sample(records, i, tokenizer, options));
  return samples;
}

}  // namespace mgbench::text
