#include "options.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/input_file.h"

namespace mgbench::app {

std::string error_text(const po::error& e) {
  const auto* named = dynamic_cast<const po::error_with_option_name*>(&e);
  if (named == nullptr) return e.what();
  // The quoted tokens are protected members: read through a derived class's member pointer.
  struct Tokens : po::error_with_option_name {
    static std::map<std::string, std::string> of(const po::error_with_option_name& error) {
      return error.*(&Tokens::m_substitutions);
    }
  };
  po::error_with_option_name copy = *named;
  for (auto [key, value] : Tokens::of(*named)) {
    if (value.find('%') == std::string::npos) continue;
    for (std::size_t at = value.find('%'); at != std::string::npos; at = value.find('%', at + 3)) {
      value.replace(at, 1, "\xef\xbc\x85");  // U+FF05 FULLWIDTH PERCENT SIGN
    }
    copy.set_substitute(key, value);
  }
  return copy.what();
}

namespace {

/// The first operand of argv beyond what `positional` takes (Boost's error does not name it).
std::string stray_operand(int argc, char** argv, const po::options_description& options,
                          const po::positional_options_description& positional) {
  const auto parsed = po::command_line_parser(argc, argv).options(options).allow_unregistered().run();
  unsigned taken = 0;
  for (const auto& o : parsed.options) {
    if (o.position_key < 0) continue;  // an option, not an operand
    if (taken++ == positional.max_total_count() && !o.value.empty()) return o.value.front();
  }
  return "?";
}

}  // namespace

std::set<std::string> parse(int argc, char** argv, const po::options_description& options, po::variables_map& vm,
                            const po::positional_options_description& positional) {
  std::set<std::string> command_line;
  try {
    const po::parsed_options typed = po::command_line_parser(argc, argv).options(options).positional(positional).run();
    for (const auto& option : typed.options) command_line.insert(option.string_key);
    po::store(typed, vm);
    if (vm.count("config") != 0) {
      const std::string path = vm["config"].as<std::string>();
      // A directory opens as a stream that reads nothing (the run would silently take the defaults),
      // a FIFO blocks the open.
      std::error_code ec;
      MGBENCH_REQUIRE(std::filesystem::exists(path, ec), ConfigError, "--config {}: no such file", path);
      try {
        require_regular_file(path, "--config");
      } catch (const DataError& e) {
        throw ConfigError(fmt::format("{}; expected an INI file", e.what()));
      }
      std::ifstream file(path);
      MGBENCH_REQUIRE(file.good(), ConfigError, "--config {}: cannot open the file", path);
      try {
        const po::parsed_options parsed = po::parse_config_file(file, options);
        // `config = other.ini` inside a configuration file would be dropped (the command line's
        // --config wins): includes are not supported, so say so.
        for (const auto& option : parsed.options) {
          MGBENCH_REQUIRE(option.string_key != "config", ConfigError,
                          "--config {}: the key 'config' (an include of another file) is not supported in a "
                          "configuration file; merge the files, or give the other with --config instead",
                          path);
        }
        po::store(parsed, vm);
      } catch (const po::error& e) {
        throw ConfigError(fmt::format("--config {}: {}", path, error_text(e)));
      }
    }
    po::notify(vm);
  } catch (const po::too_many_positional_options_error&) {
    throw ConfigError(
        fmt::format("'{}': unexpected (every option is --name, with its value after it; {})",
                    stray_operand(argc, argv, options, positional),
                    positional.max_total_count() == 0 ? "this command takes no operands" : "too many operands"));
  } catch (const po::error& e) {
    throw ConfigError(error_text(e));
  }
  return command_line;
}

void describe(const options::OptionTable& table, po::options_description& into, po::options_description* hidden,
              po::positional_options_description* positional) {
  // One section per caption, in the order of their first option.
  std::vector<std::pair<std::string, std::unique_ptr<po::options_description>>> sections;
  for (const auto& o : table.options()) {
    if (o.positional != 0 && hidden != nullptr && positional != nullptr) {
      // Operands: one token each, collected in order (the usage line names them).
      hidden->add_options()(o.name.c_str(), po::value<std::vector<std::string>>()->composing(), o.help.c_str());
      positional->add(o.name.c_str(), o.positional);
      continue;
    }
    auto section = std::find_if(sections.begin(), sections.end(), [&](const auto& s) { return s.first == o.section; });
    if (section == sections.end()) {
      section = sections.emplace(sections.end(), o.section,
                                 std::make_unique<po::options_description>(o.section, kLineLength, kDescriptionLength));
    }
    if (o.repeatable || o.positional != 0) {
      section->second->add_options()(
          o.name.c_str(), po::value<std::vector<std::string>>()->composing()->value_name(o.value_name), o.help.c_str());
      continue;
    }
    auto* value = po::value<std::string>()->value_name(o.value_name);
    if (o.is_switch) {
      value->implicit_value("true")->zero_tokens();
    } else if (!o.required) {
      value->default_value(o.text());
    }
    section->second->add_options()(o.name.c_str(), value, o.help.c_str());
  }
  for (const auto& section : sections) into.add(*section.second);
}

void apply_values(const po::variables_map& vm, options::OptionTable& table, const std::set<std::string>& command_line) {
  for (auto& o : table.options()) {
    const auto it = vm.find(o.name);
    if (it == vm.end() || it->second.defaulted()) continue;
    if (o.repeatable || o.positional != 0) {
      for (const auto& item : it->second.as<std::vector<std::string>>()) table.append(o.name, item);
    } else {
      table.set(o.name, it->second.as<std::string>());
    }
    o.on_command_line = command_line.contains(o.name);
  }
}

namespace {

/// True when argv holds -h or --help: the help is printed whatever else argv holds.
bool wants_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

/// --ranks "8" or "1,2,4,8": increasing rank counts from 1 to 4096 (the option tables' list of
/// integers, then its bounds). Throws ConfigError naming the option.
std::vector<int> parse_rank_counts(const std::string& text) {
  constexpr std::int64_t kMostRanks = 4096;
  std::vector<std::int64_t> counts;
  options::from_text("ranks", text, counts);
  for (std::size_t i = 0; i < counts.size(); ++i) {
    MGBENCH_REQUIRE(counts[i] >= 1 && counts[i] <= kMostRanks && (i == 0 || counts[i] > counts[i - 1]), ConfigError,
                    "--ranks '{}': expected increasing positive rank counts up to {}, e.g. 8 or 1,2,4,8", text,
                    kMostRanks);
  }
  MGBENCH_REQUIRE(!counts.empty(), ConfigError, "--ranks '{}': expected increasing positive rank counts", text);
  return {counts.begin(), counts.end()};
}

}  // namespace

bool declare_options(const std::string& command, const std::function<void()>& declare, bool speak) {
  try {
    declare();
    return true;
  } catch (const std::exception& e) {
    if (speak) std::cerr << "mgbench " << command << ": internal error in the options: " << e.what() << "\n";
    return false;
  }
}

std::optional<int> parse_command(const CommandSpec& spec, options::OptionTable& table, int argc, char** argv,
                                 GeneralFlags& flags, const std::function<void()>& validate, bool speak) {
  const std::string prefix = "mgbench " + spec.name + ": ";
  po::options_description visible(spec.usage, kLineLength, kDescriptionLength);
  po::options_description hidden;
  po::positional_options_description positional;
  try {
    describe(table, visible, &hidden, &positional);
    po::options_description general("General", kLineLength, kDescriptionLength);
    if (spec.config_file) {
      general.add_options()("config", po::value<std::string>()->value_name("FILE"),
                            "INI file of `option = value` lines; the command line overrides it");
    }
    if (spec.dry_run) {
      general.add_options()("dry-run", "validate the configuration, print it and exit");
      general.add_options()("ranks", po::value<std::string>()->value_name("N[,N...]"),
                            "with --dry-run: the rank counts of the memory plan (default 1,2,4,8)");
    }
    if (spec.verbose) general.add_options()("verbose", "log at debug level on every rank");
    general.add_options()("help,h", "show this help");
    visible.add(general);
    if (wants_help(argc, argv)) {
      if (speak) std::cout << visible << "\n";
      return 0;
    }
    po::options_description all;
    all.add(visible).add(hidden);
    po::variables_map vm;
    const std::set<std::string> command_line = parse(argc, argv, all, vm, positional);
    flags.dry_run = vm.count("dry-run") != 0;
    if (spec.dry_run && vm.count("ranks") != 0) {
      MGBENCH_REQUIRE(flags.dry_run, ConfigError,
                      "--ranks: only with --dry-run (a run's ranks are the launcher's: mpirun -np N, srun -n N)");
      flags.plan_ranks = parse_rank_counts(vm["ranks"].as<std::string>());
    }
    flags.verbose = vm.count("verbose") != 0;
    apply_values(vm, table, command_line);
    table.validate(flags.dry_run);
    if (validate) validate();
  } catch (const ConfigError& e) {
    // Every rank parses the same argv and fails alike: said once, every rank exits 2.
    if (speak) std::cerr << prefix << e.what() << "\n(see mgbench " << spec.name << " --help)\n";
    return 2;
  } catch (const std::exception& e) {
    // A defect of mgbench's own option tables (an option declared twice, a default naming none).
    if (speak) std::cerr << prefix << "internal error in the options: " << e.what() << "\n";
    return 1;
  }
  return std::nullopt;
}

std::string prescan(int argc, char** argv, const std::string& name) {
  po::options_description first;
  first.add_options()(name.c_str(), po::value<std::string>())("config", po::value<std::string>());
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(first).allow_unregistered().run(), vm);
    if (vm.count(name) == 0 && vm.count("config") != 0) {
      // Only a regular file (a FIFO would block here): parse() names any other.
      std::error_code ec;
      const std::string path = vm["config"].as<std::string>();
      std::ifstream file;
      if (std::filesystem::is_regular_file(path, ec)) file.open(path);
      try {
        if (file.good() && file.is_open()) {
          po::store(po::parse_config_file(file, first, /*allow_unregistered=*/true), vm);
        }
      } catch (const po::error& e) {
        throw ConfigError(fmt::format("--config {}: {}", path, error_text(e)));
      }
    }
  } catch (const po::error& e) {
    throw ConfigError(error_text(e));
  }
  return vm.count(name) != 0 ? vm[name].as<std::string>() : "";
}

std::string join_command_line(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) out += (i > 0 ? " " : "") + std::string(argv[i]);
  return out;
}

}  // namespace mgbench::app
