#include "data/text/tools.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/timer.h"
#include "data/text/llama3_tokenizer.h"
#include "data/text/preference.h"
#include "data/text/sft.h"

namespace mgbench::text {

// --- mgbench tokenize ---------------------------------------------------------------------------

void TokenizeOptions::declare(options::OptionTable& t) {
  t.add("tokenizer", tokenizer, "tiktoken file (Llama 3's tokenizer.model: '<base64 token> <rank>' lines)")
      .required()
      .value_name("FILE");
  // Of encoding: --decode prints the text of the ids as they are.
  const auto encoding = [this] { return !decode; };
  const std::string when = "encoding (not with --decode)";
  t.add("bos", bos, "prepend <|begin_of_text|> (128000)").as_switch().only_with(encoding, when);
  t.add("eos", eos, "append <|end_of_text|> (128001)").as_switch().only_with(encoding, when);
  t.add("decode", decode, "the reverse: ids on stdin -> text on stdout").as_switch();
  t.add("report-speed", report_speed, "print the encoding speed (tokens/s, excluding file loading) on stderr")
      .as_switch()
      .only_with(encoding, when);
}

int tokenize(const TokenizeOptions& o, std::istream& in, std::ostream& out, std::ostream& err) {
  try {
    const Llama3Tokenizer tok(o.tokenizer);
    if (o.decode) {
      std::vector<std::int32_t> ids;
      for (long long id = 0; in >> id;) {
        // Checked before the narrowing: 4294967296 must not decode as id 0.
        MGBENCH_REQUIRE(id >= 0 && id < tok.vocab_size(), DataError,
                        "--decode: id {} (number {} on stdin) is outside the vocabulary [0, {})", id, ids.size() + 1,
                        tok.vocab_size());
        ids.push_back(static_cast<std::int32_t>(id));
      }
      MGBENCH_REQUIRE(in.eof(), DataError, "--decode: stdin holds a non-integer after {} ids", ids.size());
      out << tok.decode(ids);
      return 0;
    }
    const std::string input((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const double start = now_s();
    const auto ids = tok.encode(input, o.bos, o.eos);
    const double seconds = now_s() - start;
    if (o.report_speed) {
      err << fmt::format("encode: {} tokens from {} bytes in {:.4f} s = {:.0f} tokens/s\n", ids.size(), input.size(),
                         seconds, static_cast<double>(ids.size()) / seconds);
    }
    std::string line;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) line += ' ';
      line += std::to_string(ids[i]);
    }
    out << line << "\n";
  } catch (const std::exception& e) {
    err << "mgbench tokenize: " << error_message(e) << "\n";
    return 1;
  }
  return 0;
}

// --- mgbench data stats -------------------------------------------------------------------------

namespace {

/// Every name --dataset takes: the instruction templates, then the preference formats.
std::vector<std::string_view> dataset_names() {
  std::vector<std::string_view> names = options::names_of(dataset_choices());
  for (const auto name : options::names_of(preference_choices())) names.push_back(name);
  return names;
}

}  // namespace

void DatasetStatsOptions::declare(options::OptionTable& t) {
  t.add("action", action, "what to do: stats")
      .positional(1)
      .required()
      .value_name("ACTION")
      .check([](const std::string& a) { return a == "stats"; }, "stats (`mgbench data stats`)");
  t.add("dataset", dataset,
        "the template or preference format: " + options::join_names(dataset_names()) +
            " (preference formats: rows are chosen and rejected sequences)")
      .required()
      .check(
          [](const std::string& name) {
            const auto names = dataset_names();
            return std::find(names.begin(), names.end(), name) != names.end();
          },
          options::join_names(dataset_names()));
  t.add("data", data, "local file: .json, .jsonl, .csv, .tsv (optionally .gz)").required().value_name("FILE");
  t.add("tokenizer", tokenizer, "Llama 3 tiktoken file (tokenizer.model)").required().value_name("FILE");
  t.add("max-seq-len", max_seq_len, "truncate samples to N tokens (0: no truncation)").at_least(0);
  t.add("train-on-input", train_on_input, "count the prompt tokens in the loss too").as_switch();
  t.add("dump", dump,
        "print the first N samples as JSON lines {tokens, labels} (preference rows: chosen_ and rejected_ tokens "
        "and labels)")
      .at_least(0);
}

int dataset_stats(const DatasetStatsOptions& o, std::ostream& out, std::ostream& err) {
  std::optional<DatasetKind> kind;           // an instruction dataset (sft.h), or
  std::optional<PreferenceKind> preference;  // a preference dataset (preference.h)
  for (const auto& row : dataset_choices()) {
    if (row.name == o.dataset) kind = row.value;
  }
  for (const auto& row : preference_choices()) {
    if (row.name == o.dataset) preference = row.value;
  }
  try {
    const Llama3Tokenizer tok(o.tokenizer);
    // The sequences to count: one per row, or a preference row's chosen and rejected.
    std::vector<TokenizedSample> samples;
    std::size_t rows = 0;
    if (preference) {
      const auto pairs = load_preference_dataset(o.data, tok, {*preference, o.max_seq_len, o.train_on_input});
      rows = pairs.size();
      for (std::size_t i = 0; i < pairs.size(); ++i) {
        if (i < static_cast<std::size_t>(o.dump)) {
          out << nlohmann::json{{"chosen_tokens", pairs[i].chosen.tokens},
                                {"chosen_labels", pairs[i].chosen.labels},
                                {"rejected_tokens", pairs[i].rejected.tokens},
                                {"rejected_labels", pairs[i].rejected.labels}}
                     .dump()
              << "\n";
        }
        samples.push_back(pairs[i].chosen);
        samples.push_back(pairs[i].rejected);
      }
    } else {
      samples = load_sft_dataset(o.data, tok, {*kind, o.max_seq_len, o.train_on_input});
      rows = samples.size();
      for (std::size_t i = 0; i < std::min<std::size_t>(samples.size(), static_cast<std::size_t>(o.dump)); ++i) {
        out << nlohmann::json{{"tokens", samples[i].tokens}, {"labels", samples[i].labels}}.dump() << "\n";
      }
    }
    if (o.dump > 0) return 0;
    std::vector<std::int64_t> lengths;
    std::int64_t trained = 0, truncated = 0;
    for (const auto& s : samples) {
      lengths.push_back(static_cast<std::int64_t>(s.tokens.size()));
      trained += std::count_if(s.labels.begin(), s.labels.end(), [](std::int32_t l) { return l != kIgnoreIndex; });
    }
    // Rows that lost tokens to --max-seq-len: a preference row when either of its sequences did.
    for (std::size_t i = 0; i < samples.size(); i += preference ? 2 : 1) {
      truncated += (samples[i].truncated || (preference && samples[i + 1].truncated)) ? 1 : 0;
    }
    std::sort(lengths.begin(), lengths.end());
    const auto total = std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0});
    auto pct = [&](double p) {
      if (lengths.empty()) return std::int64_t{0};
      return lengths[static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(lengths.size()))) -
                     (p > 0 ? 1 : 0)];
    };
    out << fmt::format("# {} ({}), {} rows{}, Llama 3 tokens, max_seq_len {}\n", o.data, o.dataset, rows,
                       preference ? fmt::format(" ({} sequences: chosen and rejected)", samples.size()) : "",
                       o.max_seq_len > 0 ? std::to_string(o.max_seq_len) : "none");
    out << fmt::format("{:<18} {}\n", "tokens", total);
    out << fmt::format("{:<18} {} ({:.1f} %)\n", "tokens with loss", trained,
                       total > 0 ? 100.0 * static_cast<double>(trained) / static_cast<double>(total) : 0.0);
    out << fmt::format("{:<18} {:.1f}\n", "length mean (seq)",
                       samples.empty() ? 0.0 : static_cast<double>(total) / static_cast<double>(samples.size()));
    out << fmt::format("{:<18} min {} | p50 {} | p90 {} | p99 {} | max {}\n", "length", pct(0), pct(50), pct(90),
                       pct(99), lengths.empty() ? 0 : lengths.back());
    if (o.max_seq_len > 0) out << fmt::format("{:<18} {}\n", "truncated rows", truncated);
  } catch (const std::exception& e) {
    err << "mgbench data: " << error_message(e) << "\n";
    return 1;
  }
  return 0;
}

}  // namespace mgbench::text
