#pragma once
// The one place where command lines meet Boost.Program_options: every command declares its options
// in an option table (core/option_table.h) and reads its command line with parse_command, so every
// command has the same --help layout, typed values, messages and exit codes; config files (--config)
// below the command line.
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "core/option_table.h"

namespace mgbench::app {

namespace po = boost::program_options;

/// --help layout: 120 columns, descriptions from column 60.
inline constexpr unsigned kLineLength = 120;
inline constexpr unsigned kDescriptionLength = 60;

/// A command's command line besides its option table: the --help header and the general options
/// it takes (--help always).
struct CommandSpec {
  std::string name;          // "report": messages say "mgbench report: ..."
  std::string usage;         // --help's text above the options (what it does, a usage line)
  bool config_file = false;  // --config FILE: `option = value` lines below the command line
  bool dry_run = false;      // --dry-run: validate, print the configuration, exit
  bool verbose = false;      // --verbose: debug logging on every rank
};

/// What the general options asked for.
struct GeneralFlags {
  bool dry_run = false;
  bool verbose = false;
  std::vector<int> plan_ranks{1, 2, 4, 8};  // --ranks N[,N...] (with --dry-run): the memory plan's rank counts
};

/// Reads argv (argv[0]: the command's name) into table: the options by name, the table's
/// positional options from the operands, --config's file below the command line; then the table's
/// checks and `validate` (the component's rules between options; throws ConfigError). Returns the
/// exit code to end with -- 0 after printing --help, 2 after a ConfigError ("mgbench <name>: <what>
/// (see mgbench <name> --help)"), 1 for a defect of the table itself -- or std::nullopt to go on.
/// speak: whether this process prints (rank 0 of an MPI job; every rank parses alike).
std::optional<int> parse_command(const CommandSpec& spec, options::OptionTable& table, int argc, char** argv,
                                 GeneralFlags& flags, const std::function<void()>& validate = {}, bool speak = true);

/// Runs declare (a component declaring its options into a table); false after saying "mgbench
/// <command>: internal error in the options: ..." (when speak) if it threw: a defect of mgbench's own
/// tables (an option declared twice), not of the command line.
bool declare_options(const std::string& command, const std::function<void()>& declare, bool speak = true);

/// The whole front of a command without MPI: Options (a struct with declare(OptionTable&) and its
/// usage text kUsage) declared into the command's table, argv parsed into it (parse_command), then
/// run(options)'s exit code.
template <typename Options, typename Run>
int run_command(const CommandSpec& spec, int argc, char** argv, Run&& run) {
  Options options;
  options::OptionTable table;
  if (!declare_options(spec.name, [&] { options.declare(table); })) return 1;
  GeneralFlags flags;
  if (auto exit_code = parse_command(spec, table, argc, argv, flags)) return *exit_code;
  return run(options);
}

/// The value of one option of argv or of its --config file, without reading the rest (which may
/// depend on it: --recipe chooses the options there are); "" when absent. Throws ConfigError for a
/// malformed config file.
std::string prescan(int argc, char** argv, const std::string& name);

/// argv joined with spaces.
std::string join_command_line(int argc, char** argv);

// The steps of parse_command, for the tests (tests/fuzz/fuzz_ini.cpp).

/// e.what(), safe on any input: Boost 1.74's error_with_option_name::what() loops forever when a
/// token it quotes contains its own placeholder (a config line "x%invalid_line%" hung every
/// command; found by tests/fuzz/fuzz_ini), so quoted tokens show '%' as U+FF05 ('％').
std::string error_text(const po::error& e);

/// Parses argv into vm (positional: the operands' options). When --config FILE is given, FILE's
/// `key = value` lines (the long option names) fill what the command line left unset. Returns the
/// names of the options given on the command line (for apply_values). Throws ConfigError naming
/// the option, value or file at fault.
std::set<std::string> parse(int argc, char** argv, const po::options_description& options, po::variables_map& vm,
                            const po::positional_options_description& positional = {});

/// The table's options as Boost descriptions, one section per table section, in order; every
/// value is read as text (the table parses it), switches take none, positional options go into
/// `hidden` (not listed by --help: the usage names them) and `positional`.
void describe(const options::OptionTable& table, po::options_description& into,
              po::options_description* hidden = nullptr, po::positional_options_description* positional = nullptr);

/// Hands every value the command line or config file gave (not Boost's defaults) to the table,
/// which parses it into its typed field; those named in `command_line` (parse's result) are marked
/// as typed there (Option::on_command_line). Throws ConfigError naming the option.
void apply_values(const po::variables_map& vm, options::OptionTable& table,
                  const std::set<std::string>& command_line = {});

}  // namespace mgbench::app
