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

void parse(int argc, char** argv, const po::options_description& options, po::variables_map& vm) {
  try {
    po::store(po::command_line_parser(argc, argv).options(options).run(), vm);
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
  } catch (const po::error& e) {
    throw ConfigError(error_text(e));
  }
}

void describe(const options::OptionTable& table, po::options_description& into) {
  // One section per caption, in the order of their first option.
  std::vector<std::pair<std::string, std::unique_ptr<po::options_description>>> sections;
  for (const auto& o : table.options()) {
    auto section = std::find_if(sections.begin(), sections.end(), [&](const auto& s) { return s.first == o.section; });
    if (section == sections.end()) {
      section = sections.emplace(sections.end(), o.section,
                                 std::make_unique<po::options_description>(o.section, kLineLength, kDescriptionLength));
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

void apply_values(const po::variables_map& vm, options::OptionTable& table) {
  for (auto& o : table.options()) {
    const auto it = vm.find(o.name);
    if (it == vm.end() || it->second.defaulted()) continue;
    table.set(o.name, it->second.as<std::string>());
  }
}

std::optional<int> parse_tool_options(const char* command, int argc, char** argv,
                                      const po::options_description& options, po::variables_map& vm) {
  if (wants_help(argc, argv)) {
    std::cout << options << "\n";
    return 0;
  }
  try {
    parse(argc, argv, options, vm);
  } catch (const ConfigError& e) {
    std::cerr << "mgbench " << command << ": " << e.what() << "\n(see mgbench " << command << " --help)\n";
    return 2;
  }
  return std::nullopt;
}

bool wants_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

std::string join_command_line(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) out += (i > 0 ? " " : "") + std::string(argv[i]);
  return out;
}

}  // namespace mgbench::app
