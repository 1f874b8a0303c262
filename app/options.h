#pragma once
// Shared command-line plumbing (Boost.Program_options): config files below the command line,
// option tables (core/option_table.h) as --help sections, errors as ConfigError.
#include <optional>
#include <string>

#include <boost/program_options.hpp>

#include "core/option_table.h"

namespace mgbench::app {

namespace po = boost::program_options;

/// --help layout: 120 columns, descriptions from column 60.
inline constexpr unsigned kLineLength = 120;
inline constexpr unsigned kDescriptionLength = 60;

/// e.what(), safe on any input: Boost 1.74's error_with_option_name::what() loops forever when a
/// token it quotes contains its own placeholder (a config line "x%invalid_line%" hung every
/// command; found by tests/fuzz/fuzz_ini), so quoted tokens show '%' as U+FF05 ('％').
std::string error_text(const po::error& e);

/// Parses argv (argv[0] = subcommand name) into vm. When --config FILE is given, FILE's
/// `key = value` lines (the long option names) fill what the command line left unset.
/// Throws ConfigError naming the option, value or file at fault.
void parse(int argc, char** argv, const po::options_description& options, po::variables_map& vm);

/// The table's options as Boost descriptions, one section per table section, in order; every
/// value is read as text (the table parses it), switches take none.
void describe(const options::OptionTable& table, po::options_description& into);

/// Hands every value the command line or config file gave (not Boost's defaults) to the table,
/// which parses it into its typed field. Throws ConfigError naming the option.
void apply_values(const po::variables_map& vm, options::OptionTable& table);

/// True when argv holds -h or --help: commands with required options print their help before
/// parsing would complain about a missing one.
bool wants_help(int argc, char** argv);

/// The option handling of a single-process tool (`mgbench tokenize`, `mgbench quantize`): prints
/// the help (0) or the error with a pointer to the help (2) and returns the exit code, or parses
/// argv into vm and returns std::nullopt (go on). command: "tokenize", for the messages.
std::optional<int> parse_tool_options(const char* command, int argc, char** argv,
                                      const po::options_description& options, po::variables_map& vm);

/// argv joined with spaces.
std::string join_command_line(int argc, char** argv);

}  // namespace mgbench::app
