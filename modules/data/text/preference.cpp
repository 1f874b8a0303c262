#include "data/text/preference.h"

#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/option_table.h"

namespace mgbench::text {
namespace {

ChosenRejected stack_exchange_paired_messages(const Records& records, std::size_t i, bool user_masked) {
  const std::string question = string_field(records, i, "question");
  return {{{"user", {question}, user_masked}, {"assistant", {string_field(records, i, "response_j")}, false}},
          {{"user", {question}, user_masked}, {"assistant", {string_field(records, i, "response_k")}, false}}};
}

/// "\n\nHuman: a\n\nAssistant: b..." as messages: the text after each marker, up to the next one.
std::vector<Message> hh_transcript(const Records& records, std::size_t i, const char* field, bool user_masked) {
  constexpr std::string_view kHuman = "\n\nHuman: ";
  constexpr std::string_view kAssistant = "\n\nAssistant: ";
  const std::string text = string_field(records, i, field);
  std::vector<Message> messages;
  std::size_t at = 0;
  while (at < text.size()) {
    const bool human = text.compare(at, kHuman.size(), kHuman) == 0;
    MGBENCH_REQUIRE(human || text.compare(at, kAssistant.size(), kAssistant) == 0, DataError,
                    "{}: field \"{}\" at byte {}: expected a \"\\n\\nHuman: \" or \"\\n\\nAssistant: \" turn",
                    records.where(i), field, at);
    const std::size_t start = at + (human ? kHuman.size() : kAssistant.size());
    std::size_t end = std::min(text.find(kHuman, start), text.find(kAssistant, start));
    if (end == std::string::npos) end = text.size();
    messages.push_back({human ? "user" : "assistant", {text.substr(start, end - start)}, human && user_masked});
    at = end;
  }
  MGBENCH_REQUIRE(!messages.empty() && messages.back().role == "assistant", DataError,
                  "{}: field \"{}\": expected a transcript ending with an Assistant turn", records.where(i), field);
  return messages;
}

ChosenRejected hh_rlhf_messages(const Records& records, std::size_t i, bool user_masked) {
  return {hh_transcript(records, i, "chosen", user_masked), hh_transcript(records, i, "rejected", user_masked)};
}

ChosenRejected preference_messages(const Records& records, std::size_t i, bool user_masked) {
  const auto& row = records.rows[i];
  const std::vector<Message> prompt = sharegpt_conversation(records, i, user_masked);
  ChosenRejected out{prompt, prompt};
  for (const char* field : {"chosen", "rejected"}) {
    MGBENCH_REQUIRE(row.contains(field), DataError, "{}: missing field \"{}\" (a {{from, value}} turn)",
                    records.where(i), field);
    Message answer = sharegpt_turn(records, i, row[field], fmt::format("field \"{}\"", field), user_masked);
    // A user's turn as the answer would be masked out of the loss (LLaMA-Factory refuses it too).
    MGBENCH_REQUIRE(answer.role == "assistant", DataError,
                    "{}: field \"{}\" is a {} turn: expected the assistant's answer (from \"gpt\")", records.where(i),
                    field, answer.role);
    (std::string_view(field) == "chosen" ? out.chosen : out.rejected).push_back(std::move(answer));
  }
  return out;
}

constexpr PreferenceInfo kPreferences[] = {
    {"stack_exchange_paired", PreferenceKind::kStackExchangePaired,
     "question / response_j (chosen) / response_k (rejected) (TorchTune's stack_exchange_paired_dataset)",
     &stack_exchange_paired_messages},
    {"hh_rlhf", PreferenceKind::kHhRlhf,
     "Anthropic HH-RLHF transcripts: chosen / rejected strings of \\n\\nHuman: / \\n\\nAssistant: turns",
     &hh_rlhf_messages},
    {"preference", PreferenceKind::kPreference,
     "ShareGPT ranking rows: conversations [{from, value}], chosen / rejected {from, value} (LLaMA-Factory)",
     &preference_messages},
};

}  // namespace

std::span<const PreferenceInfo> preference_choices() { return kPreferences; }

PreferenceSample make_preference_sample(const Records& records, std::size_t i, const Llama3Tokenizer& tokenizer,
                                        const PreferenceOptions& options) {
  try {
    const PreferenceInfo& format = mgbench::options::row_of(preference_choices(), options.kind);
    const ChosenRejected messages = format.messages(records, i, /*user_masked=*/!options.train_on_input);
    return {tokenize_messages(messages.chosen, tokenizer, options.max_seq_len),
            tokenize_messages(messages.rejected, tokenizer, options.max_seq_len)};
  } catch (const DataError& e) {
    if (std::string(e.what()).find(records.path) != std::string::npos) throw;
    throw DataError(fmt::format("{}: {}", records.where(i), e.what()));
  }
}

std::vector<PreferenceSample> load_preference_dataset(const std::string& path, const Llama3Tokenizer& tokenizer,
                                                      const PreferenceOptions& options) {
  const Records records = read_records(path);
  std::vector<PreferenceSample> samples;
  samples.reserve(records.rows.size());
  for (std::size_t i = 0; i < records.rows.size(); ++i) {
    samples.push_back(make_preference_sample(records, i, tokenizer, options));
  }
  return samples;
}

}  // namespace mgbench::text
