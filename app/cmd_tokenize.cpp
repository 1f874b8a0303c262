// `mgbench tokenize`: UTF-8 text on stdin -> Llama 3 token ids on stdout (data/text/tools.h).
#include <iostream>

#include "commands.h"
#include "data/text/tools.h"
#include "options.h"

namespace mgbench::app {

int tokenize_main(int argc, char** argv) {
  text::TokenizeOptions options;
  options::OptionTable table;
  options.declare(table);
  const CommandSpec spec{"tokenize",
                         "mgbench tokenize: read UTF-8 text on stdin, print its Llama 3 token ids (tiktoken BPE) on "
                         "one line.\nusage: mgbench tokenize --tokenizer FILE [--bos] [--eos] < text\noptions"};
  GeneralFlags flags;
  if (auto exit_code = parse_command(spec, table, argc, argv, flags)) return *exit_code;
  return text::tokenize(options, std::cin, std::cout, std::cerr);
}

}  // namespace mgbench::app
