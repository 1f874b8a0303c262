#pragma once
// Reading back what OptionTable::ini() writes (core/option_table.h): a run's `config` attribute,
// --config's "name = value" lines. Defined beside ini() in option_table.cpp.
#include <string>
#include <utility>
#include <vector>

namespace mgbench::options {

/// The "name = value" lines of text, as (name, value) pairs in order; other lines (comments, blank,
/// malformed) skipped.
std::vector<std::pair<std::string, std::string>> ini_lines(const std::string& text);

}  // namespace mgbench::options
