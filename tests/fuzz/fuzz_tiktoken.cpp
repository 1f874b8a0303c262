// tiktoken BPE files (`<base64 token> <rank>` lines) and the Llama 3 encoder over them: the input is the
// file, a NUL, then a text to encode with the file's vocabulary. Whatever loads must encode any
// text to ids the decoder turns back into that text.
#include <algorithm>
#include <string_view>

#include "data/text/llama3_tokenizer.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* begin = reinterpret_cast<const char*>(data);
  const std::string_view input(begin, size);
  const std::size_t nul = std::min(input.find('\0'), input.size());
  const std::string path = mgbench::fuzz::write_input(data, nul, "tokenizer.model");
  const std::string_view text = nul < input.size() ? input.substr(nul + 1) : std::string_view();
  mgbench::fuzz::expect_clean_errors([&] {
    const mgbench::text::Llama3Tokenizer tokenizer(path);
    const std::vector<std::int32_t> ids = tokenizer.encode(text, false, false);
    // A vocabulary without all 256 single bytes cannot encode every text: then encode throws a
    // DataError (caught above); what it returns must decode to the text.
    if (tokenizer.decode(ids) != text) __builtin_trap();
  });
  return 0;
}
