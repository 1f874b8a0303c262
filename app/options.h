#pragma once
// Shared command-line plumbing (Boost.Program_options): config files below the command line,
// the resolved configuration as INI text, errors as ConfigError.
#include <string>

#include <boost/program_options.hpp>

namespace mgbench::app {

namespace po = boost::program_options;

/// Parses argv (argv[0] = subcommand name) into vm. When --config FILE is given, FILE's
/// `key = value` lines (the long option names) fill what the command line left unset.
/// Throws ConfigError naming the option, value or file at fault.
void parse(int argc, char** argv, const po::options_description& options, po::variables_map& vm);

/// The resolved options as INI text ("key = value" lines, loadable with --config),
/// leaving out `config` itself and options listed in skip (comma-separated).
std::string to_ini(const po::variables_map& vm, const std::string& skip = "");

/// True when argv holds -h or --help: commands with required options print their help before
/// parsing would complain about a missing one.
bool wants_help(int argc, char** argv);

/// argv joined with spaces.
std::string join_command_line(int argc, char** argv);

}  // namespace mgbench::app
