// `mgbench data stats`: rows and token lengths of a fine-tuning dataset as `mgbench llm` sees it
// (data/text/tools.h); `--dump N` prints the first N samples.
#include <iostream>

#include "commands.h"
#include "data/text/tools.h"
#include "options.h"

namespace mgbench::app {

int data_main(int argc, char** argv) {
  text::DatasetStatsOptions options;
  options::OptionTable table;
  options.declare(table);
  const CommandSpec spec{
      "data",
      "mgbench data stats: rows and token lengths of a fine-tuning dataset (template + Llama 3 tokenizer).\n"
      "usage: mgbench data stats --dataset KIND --data FILE --tokenizer FILE [--max-seq-len N] [--dump N]\noptions"};
  GeneralFlags flags;
  if (auto exit_code = parse_command(spec, table, argc, argv, flags)) return *exit_code;
  return text::dataset_stats(options, std::cout, std::cerr);
}

}  // namespace mgbench::app
