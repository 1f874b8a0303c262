#pragma once
// Preference data for DPO, with TorchTune 0.6.1's PreferenceDataset semantics
// (torchtune/datasets/_preference.py): a row becomes a chosen and a rejected conversation, each
// tokenised on its own with the Llama 3 chat format and masks (tokenize_messages: sft.h, truncated
// to max_seq_len independently), labels = tokens with masked positions -100 (not shifted).
//   stack_exchange_paired  question -> user, response_j -> chosen, response_k -> rejected
//                          (TorchTune's stack_exchange_paired_dataset / StackExchangePairedToMessages)
//   hh_rlhf                Anthropic HH-RLHF raw transcripts: `chosen` and `rejected` strings of
//                          "\n\nHuman: ..." / "\n\nAssistant: ..." turns (the prompt is their shared
//                          start), each turn a message (as ChosenRejectedToMessages would see them)
//   preference             ShareGPT ranking rows (LLaMA-Factory's dpo_en_demo): `conversations`
//                          [{from: system|human|gpt, value}] then `chosen` / `rejected` {from: gpt, value}
// Masking as TorchTune's ChosenRejectedToMessages: every non-assistant message masked unless
// train_on_input.
// Adding a preference format: a messages function and a row in preference.cpp.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/text/llama3_tokenizer.h"
#include "data/text/records.h"
#include "data/text/sft.h"

namespace mgbench::text {

enum class PreferenceKind { kStackExchangePaired, kHhRlhf, kPreference };

struct ChosenRejected {
  std::vector<Message> chosen;
  std::vector<Message> rejected;
};

/// A row of the preference table (--dataset of the dpo recipe).
struct PreferenceInfo {
  std::string_view name;
  PreferenceKind value;
  std::string_view help;
  /// Row i of records as the two conversations. Throws DataError naming file, row and field.
  ChosenRejected (*messages)(const Records& records, std::size_t i, bool user_masked);
};

std::span<const PreferenceInfo> preference_choices();

struct PreferenceOptions {
  PreferenceKind kind = PreferenceKind::kStackExchangePaired;
  std::int64_t max_seq_len = 0;  // 0: no truncation; else each of chosen and rejected cut to it
  bool train_on_input = false;   // also label the prompt's tokens
};

struct PreferenceSample {
  TokenizedSample chosen;
  TokenizedSample rejected;
};

/// The label tokens of the pair's poorer side: a pair with a side of none has no preference to learn.
inline std::int64_t label_tokens(const PreferenceSample& p) {
  return std::min(label_tokens(p.chosen), label_tokens(p.rejected));
}

/// The tokens of the pair's longer side.
inline std::int64_t sequence_tokens(const PreferenceSample& p) {
  return std::max(sequence_tokens(p.chosen), sequence_tokens(p.rejected));
}

/// The sample of row i. Throws DataError naming file, row and field.
PreferenceSample make_preference_sample(const Records& records, std::size_t i, const Llama3Tokenizer& tokenizer,
                                        const PreferenceOptions& options);

/// Every row of path (read_records + make_preference_sample).
std::vector<PreferenceSample> load_preference_dataset(const std::string& path, const Llama3Tokenizer& tokenizer,
                                                      const PreferenceOptions& options);

}  // namespace mgbench::text
