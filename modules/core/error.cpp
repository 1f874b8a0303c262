#include "core/error.h"

#include <mpi.h>

namespace mgbench {

int exit_code_for(const std::exception& e) noexcept { return dynamic_cast<const ConfigError*>(&e) != nullptr ? 2 : 1; }

std::string error_message(const std::exception& e) {
  std::string text = e.what();
  // c10::Error appends its C++ backtrace after one of two headers: TORCH_CHECK's source location,
  // or, for C10_ENFORCE (the CPU allocator's out-of-memory), the frames themselves.
  for (const char* header : {"\nException raised from ", "\nframe #0: "}) {
    if (const auto at = text.find(header); at != std::string::npos) text.resize(at);
  }
  return text;
}

namespace detail {
void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    fmt::format_to_n(text, sizeof(text) - 1, "MPI error {}", code);
  }
  throw CommError(fmt::format("{} failed: {} ({}:{})", call, text, file, line));
}
}  // namespace detail

}  // namespace mgbench
