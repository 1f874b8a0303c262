// `mgbench data stats`: rows and token-length distribution of a fine-tuning dataset, as mgbench
// llm would see it (template, tokenizer, truncation); `--dump N` prints the first N samples.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "data/text/preference.h"
#include "data/text/sft.h"
#include "options.h"

namespace mgbench::app {

int data_main(int argc, char** argv) {
  std::string action, dataset, data, tokenizer;
  std::int64_t max_seq_len = 0, dump = 0;
  std::optional<text::DatasetKind> kind;           // an instruction dataset (sft.h), or
  std::optional<text::PreferenceKind> preference;  // a preference dataset (preference.h)
  po::options_description options(
      "mgbench data stats: rows and token lengths of a fine-tuning dataset (template + Llama 3 tokenizer).\n"
      "usage: mgbench data stats --dataset KIND --data FILE --tokenizer FILE [--max-seq-len N] [--dump N]\n"
      "(preference kinds: rows are chosen and rejected sequences; --dump prints chosen_/rejected_ tokens and "
      "labels)\n");
  options.add_options()("dataset", po::value(&dataset)->required(),
                        "alpaca | grammar | samsum | slimorca | text | stack_exchange_paired | hh_rlhf | preference")(
      "data", po::value(&data)->required(), "local file: .json, .jsonl, .csv, .tsv (optionally .gz)")(
      "tokenizer", po::value(&tokenizer)->required(), "Llama 3 tiktoken file (tokenizer.model)")(
      "max-seq-len", po::value(&max_seq_len)->default_value(0), "truncate samples to N tokens (0: no truncation)")(
      "train-on-input", "count the prompt tokens in the loss too")(
      "dump", po::value(&dump)->default_value(0), "print the first N samples as JSON lines {tokens, labels}")(
      "help,h", "show this help");
  po::options_description hidden;
  hidden.add_options()("action", po::value(&action));
  po::options_description all;
  all.add(options).add(hidden);
  po::variables_map vm;
  try {
    if (wants_help(argc, argv)) {
      std::cout << options << "\n";
      return 0;
    }
    po::positional_options_description positional;
    positional.add("action", 1);
    po::store(po::command_line_parser(argc, argv).options(all).positional(positional).run(), vm);
    po::notify(vm);
    MGBENCH_REQUIRE(action == "stats", ConfigError, "unknown action '{}': expected `mgbench data stats`", action);
    MGBENCH_REQUIRE(max_seq_len >= 0 && dump >= 0, ConfigError, "--max-seq-len and --dump must be >= 0");
    for (const auto& row : text::dataset_choices()) {
      if (row.name == dataset) kind = row.value;
    }
    for (const auto& row : text::preference_choices()) {
      if (row.name == dataset) preference = row.value;
    }
    if (!kind && !preference) {
      std::vector<std::string_view> names = options::names_of(text::dataset_choices());
      for (const auto name : options::names_of(text::preference_choices())) names.push_back(name);
      options::fail("dataset", dataset, options::join_names(names));
    }
  } catch (const po::error& e) {
    std::cerr << "mgbench data: " << error_text(e) << "\n(see mgbench data --help)\n";
    return 2;
  } catch (const ConfigError& e) {
    std::cerr << "mgbench data: " << e.what() << "\n(see mgbench data --help)\n";
    return 2;
  }
  try {
    const bool train_on_input = vm.count("train-on-input") != 0;
    const text::Llama3Tokenizer tok(tokenizer);
    // The sequences to count: one per row, or a preference row's chosen and rejected.
    std::vector<text::TokenizedSample> samples;
    std::size_t rows = 0;
    if (preference) {
      const auto pairs = text::load_preference_dataset(data, tok, {*preference, max_seq_len, train_on_input});
      rows = pairs.size();
      for (std::size_t i = 0; i < pairs.size(); ++i) {
        if (i < static_cast<std::size_t>(dump)) {
          std::cout << nlohmann::json{{"chosen_tokens", pairs[i].chosen.tokens},
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
      samples = text::load_sft_dataset(data, tok, {*kind, max_seq_len, train_on_input});
      rows = samples.size();
      for (std::size_t i = 0; i < std::min<std::size_t>(samples.size(), static_cast<std::size_t>(dump)); ++i) {
        std::cout << nlohmann::json{{"tokens", samples[i].tokens}, {"labels", samples[i].labels}}.dump() << "\n";
      }
    }
    if (dump > 0) return 0;
    std::vector<std::int64_t> lengths;
    std::int64_t trained = 0, truncated = 0;
    for (const auto& s : samples) {
      lengths.push_back(static_cast<std::int64_t>(s.tokens.size()));
      trained +=
          std::count_if(s.labels.begin(), s.labels.end(), [](std::int32_t l) { return l != text::kIgnoreIndex; });
      truncated += (max_seq_len > 0 && static_cast<std::int64_t>(s.tokens.size()) >= max_seq_len) ? 1 : 0;
    }
    std::sort(lengths.begin(), lengths.end());
    const auto total = std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0});
    auto pct = [&](double p) {
      if (lengths.empty()) return std::int64_t{0};
      return lengths[static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(lengths.size()))) -
                     (p > 0 ? 1 : 0)];
    };
    std::cout << fmt::format("# {} ({}), {} rows{}, Llama 3 tokens, max_seq_len {}\n", data, dataset, rows,
                             preference ? fmt::format(" ({} sequences: chosen and rejected)", samples.size()) : "",
                             max_seq_len > 0 ? std::to_string(max_seq_len) : "none");
    std::cout << fmt::format("{:<18} {}\n", "tokens", total);
    std::cout << fmt::format("{:<18} {} ({:.1f} %)\n", "tokens with loss", trained,
                             total > 0 ? 100.0 * static_cast<double>(trained) / static_cast<double>(total) : 0.0);
    std::cout << fmt::format("{:<18} {:.1f}\n", "length mean (seq)",
                             samples.empty() ? 0.0 : static_cast<double>(total) / static_cast<double>(samples.size()));
    std::cout << fmt::format("{:<18} min {} | p50 {} | p90 {} | p99 {} | max {}\n", "length", pct(0), pct(50), pct(90),
                             pct(99), lengths.empty() ? 0 : lengths.back());
    if (max_seq_len > 0) std::cout << fmt::format("{:<18} {}\n", "truncated rows", truncated);
  } catch (const std::exception& e) {
    std::cerr << "mgbench data: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace mgbench::app
