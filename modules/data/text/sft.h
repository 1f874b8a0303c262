#pragma once
// Fine-tuning samples with TorchTune's templates and masking (torchtune 0.6: data/_messages.py
// AlpacaToMessages / InputOutputToMessages / ShareGPTToMessages, data/_prompt_templates.py,
// models/llama3/_tokenizer.py tokenize_messages, datasets/_sft.py, datasets/_text_completion.py):
//   tokens = <|begin_of_text|> + per message: <|start_header_id|> role <|end_header_id|> "\n\n"
//            + content (each text piece stripped and encoded separately) + <|eot_id|>  + <|end_of_text|>
//   labels = tokens, with -100 on masked messages, on <|begin_of_text|> and <|end_of_text|>
// Labels are aligned with tokens (not shifted): the loss predicts labels[t + 1] from position t.
//   alpaca    user: Alpaca prompt (with / without input), assistant: output
//   grammar   user: "Correct this to standard English: " + input + "\n---\nCorrected: ", assistant: output
//   samsum    user: "Summarize this dialogue:\n" + dialogue + "\n---\nSummary:\n", assistant: summary
//   slimorca  ShareGPT conversations (system / human / gpt) in Llama 3 chat format
//   text      the `text` field with BOS and EOS, loss on every token
// Masking: by default only assistant messages carry loss (--train-on-input puts the user's and
// system's in too, as TorchTune 0.6.1 does; its alpaca_dataset defaults to that, its other
// datasets do not). With max_seq_len,
// sequences are cut to max_seq_len and the last token becomes <|end_of_text|> (TorchTune's truncate).
// Adding a dataset template: a messages function and one row in sft.cpp's table.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/text/llama3_tokenizer.h"
#include "data/text/records.h"

namespace mgbench::text {

enum class DatasetKind { kAlpaca, kGrammar, kSamsum, kSlimOrca, kText };

/// A chat message of a sample, as TorchTune's Message.
struct Message {
  std::string role;                  // system | user | assistant
  std::vector<std::string> content;  // text pieces, each stripped and encoded on its own (TorchTune)
  bool masked = false;               // no loss on its tokens
};

/// A row of the dataset table (--dataset): the template that turns a record into messages.
struct DatasetInfo {
  std::string_view name;
  DatasetKind value;
  std::string_view help;
  /// Row i of records as messages; user_masked: the non-assistant messages carry no loss. Throws
  /// DataError naming the field. nullptr: plain text (the `text` field, loss on every token).
  std::vector<Message> (*messages)(const Records& records, std::size_t i, bool user_masked);
};

std::span<const DatasetInfo> dataset_choices();

/// A ShareGPT turn {from: system | human | gpt, value} as a message (TorchTune 0.6.1's
/// ShareGPTToMessages: every non-assistant turn masked when user_masked). where: the turn's place
/// for messages ("conversation turn 3"). Throws DataError naming the row.
Message sharegpt_turn(const Records& records, std::size_t i, const nlohmann::json& turn, const std::string& where,
                      bool user_masked);
/// Row i's "conversations" list of ShareGPT turns as messages (slimorca; the prompt of a ShareGPT
/// preference row). Throws DataError naming the row and turn.
std::vector<Message> sharegpt_conversation(const Records& records, std::size_t i, bool user_masked);

inline constexpr std::int32_t kIgnoreIndex = -100;

struct SftOptions {
  DatasetKind kind = DatasetKind::kAlpaca;
  std::int64_t max_seq_len = 0;  // 0: no truncation
  bool train_on_input = false;   // also compute the loss on user and system tokens
};

struct TokenizedSample {
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> labels;  // same length; kIgnoreIndex where no loss
  bool truncated = false;            // --max-seq-len cut tokens (or whole messages) off it
};

/// The tokens of s that carry loss (labels not kIgnoreIndex).
inline std::int64_t label_tokens(const TokenizedSample& s) {
  std::int64_t n = 0;
  for (const std::int32_t label : s.labels) n += label != kIgnoreIndex ? 1 : 0;
  return n;
}

/// The tokens of s (its sequence's length).
inline std::int64_t sequence_tokens(const TokenizedSample& s) { return static_cast<std::int64_t>(s.tokens.size()); }

/// TorchTune 0.6.1's validate_messages (data/_messages.py), which its SFTDataset applies to every
/// row: at least two messages, a system message only first, no two user messages in a row, no
/// assistant message but after a user message. Throws DataError naming the turn (1-based).
void validate_messages(const std::vector<Message>& messages);

/// Messages as Llama 3 chat tokens and labels (TorchTune 0.6.1's Llama3Tokenizer.tokenize_messages
/// with add_end_tokens): <|begin_of_text|>, each message's header and content and <|eot_id|>,
/// <|end_of_text|>; labels -100 on masked messages and on the begin / end tokens; cut to
/// max_seq_len (> 0) with the last token made <|end_of_text|>.
TokenizedSample tokenize_messages(const std::vector<Message>& messages, const Llama3Tokenizer& tokenizer,
                                  std::int64_t max_seq_len);

/// The sample of row i of records. Throws DataError naming file, row and field for a missing or
/// non-string field, a ShareGPT turn with an unknown role, a conversation validate_messages
/// refuses, or text that is not UTF-8.
TokenizedSample make_sample(const Records& records, std::size_t i, const Llama3Tokenizer& tokenizer,
                            const SftOptions& options);

/// Every row of path as samples (read_records + make_sample).
std::vector<TokenizedSample> load_sft_dataset(const std::string& path, const Llama3Tokenizer& tokenizer,
                                              const SftOptions& options);

}  // namespace mgbench::text
