// safetensors headers: the 8-byte length, the JSON, each tensor's dtype, shape and offsets. What
// the parser accepts must describe tensors that lie inside the file and tile its data section.
#include <string_view>

#include "fuzz_support.h"
#include "models/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  mgbench::fuzz::expect_clean_errors([&] {
    const auto header = mgbench::models::parse_safetensors_header(file, "fuzz.safetensors");
    std::size_t end = 0;
    for (const auto& [name, e] : header.entries) {
      std::size_t bytes = mgbench::models::safetensors_element_bytes(e.dtype);
      for (const auto d : e.shape) bytes *= static_cast<std::size_t>(d);
      if (bytes != e.end - e.begin || header.data_offset + e.end > size) __builtin_trap();
      end = std::max(end, e.end);
    }
    if (header.data_offset > size) __builtin_trap();
  });
  return 0;
}
