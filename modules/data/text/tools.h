#pragma once
// The text tools of the command line, on parsed options: `mgbench tokenize` (text <-> Llama 3 token
// ids) and `mgbench data stats` (rows and token lengths of a fine-tuning dataset as `mgbench llm`
// sees it: template, tokenizer, truncation). Each declares its options into the command's table.
#include <cstdint>
#include <istream>
#include <ostream>
#include <string>

#include "core/option_table.h"

namespace mgbench::text {

struct TokenizeOptions {
  /// --help's text above the options.
  static constexpr const char* kUsage =
      "mgbench tokenize: read UTF-8 text on stdin, print its Llama 3 token ids (tiktoken BPE) on one line.\n"
      "usage: mgbench tokenize --tokenizer FILE [--bos] [--eos] < text";

  std::string tokenizer;  // tiktoken file
  bool bos = false;       // prepend <|begin_of_text|>
  bool eos = false;       // append <|end_of_text|>
  bool decode = false;    // ids -> text
  bool report_speed = false;

  void declare(options::OptionTable& table);
};

/// Encodes UTF-8 text from in into token ids, space-separated on one line of out (or, with decode,
/// ids -> text); with report_speed the encoding speed (tokens/s, without loading) on err. Returns
/// the exit code: 0, or 1 with the message on err (an unreadable tokenizer file, an id outside the
/// vocabulary, a non-integer among the ids).
int tokenize(const TokenizeOptions& options, std::istream& in, std::ostream& out, std::ostream& err);

struct DatasetStatsOptions {
  /// --help's text above the options.
  static constexpr const char* kUsage =
      "mgbench data stats: rows and token lengths of a fine-tuning dataset (template + Llama 3 tokenizer).\n"
      "usage: mgbench data stats --dataset KIND --data FILE --tokenizer FILE [--max-seq-len N] [--dump N]";

  std::string action;   // "stats" (the operand)
  std::string dataset;  // a template of sft.h's table or a format of preference.h's
  std::string data;     // the dataset file
  std::string tokenizer;
  std::int64_t max_seq_len = 0;  // 0: no truncation
  bool train_on_input = false;
  std::int64_t dump = 0;  // print the first N samples as JSON lines {tokens, labels}, not the statistics

  void declare(options::OptionTable& table);
};

/// The dataset's rows, tokens, tokens with loss, length mean and percentiles (preference rows: chosen
/// and rejected sequences each), or with dump the first samples as JSON lines, on out. Returns the
/// exit code: 0, or 1 with the message on err (files, rows).
int dataset_stats(const DatasetStatsOptions& options, std::ostream& out, std::ostream& err);

}  // namespace mgbench::text
