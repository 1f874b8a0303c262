// `mgbench tokenize`: UTF-8 text on stdin -> Llama 3 token ids, space-separated, on one line.
#include <iostream>
#include <iterator>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "commands.h"
#include "core/error.h"
#include "core/timer.h"
#include "data/text/llama3_tokenizer.h"
#include "options.h"

namespace mgbench::app {

int tokenize_main(int argc, char** argv) {
  std::string tokenizer;
  po::options_description options(
      "mgbench tokenize: read UTF-8 text on stdin, print its Llama 3 token ids (tiktoken BPE) on one line.\n"
      "usage: mgbench tokenize --tokenizer FILE [--bos] [--eos] < text\n");
  options.add_options()("tokenizer", po::value(&tokenizer)->required(),
                        "tiktoken file (Llama 3's tokenizer.model: '<base64 token> <rank>' lines)")(
      "bos", "prepend <|begin_of_text|> (128000)")("eos", "append <|end_of_text|> (128001)")(
      "decode", "the reverse: ids on stdin -> text on stdout")(
      "report-speed", "print the encoding speed (tokens/s, excluding file loading) on stderr")("help,h",
                                                                                               "show this help");
  po::variables_map vm;
  if (const std::optional<int> exit_code = parse_tool_options("tokenize", argc, argv, options, vm)) return *exit_code;
  try {
    const text::Llama3Tokenizer tok(tokenizer);
    if (vm.count("decode") != 0) {
      std::vector<std::int32_t> ids;
      for (long long id = 0; std::cin >> id;) {
        // Checked before the narrowing: 4294967296 must not decode as id 0.
        MGBENCH_REQUIRE(id >= 0 && id < tok.vocab_size(), DataError,
                        "mgbench tokenize --decode: id {} (the {}th on stdin) is outside the vocabulary [0, {})", id,
                        ids.size() + 1, tok.vocab_size());
        ids.push_back(static_cast<std::int32_t>(id));
      }
      MGBENCH_REQUIRE(std::cin.eof(), DataError, "mgbench tokenize --decode: stdin holds a non-integer after {} ids",
                      ids.size());
      std::cout << tok.decode(ids);
      return 0;
    }
    const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    const double start = now_s();
    const auto ids = tok.encode(input, vm.count("bos") != 0, vm.count("eos") != 0);
    const double seconds = now_s() - start;
    if (vm.count("report-speed") != 0) {
      std::cerr << fmt::format("encode: {} tokens from {} bytes in {:.4f} s = {:.0f} tokens/s\n", ids.size(),
                               input.size(), seconds, static_cast<double>(ids.size()) / seconds);
    }
    std::string line;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) line += ' ';
      line += std::to_string(ids[i]);
    }
    std::cout << line << "\n";
  } catch (const std::exception& e) {
    std::cerr << "mgbench tokenize: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace mgbench::app
