#include "options.h"

#include <cstdint>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"

namespace mgbench::app {

void parse(int argc, char** argv, const po::options_description& options, po::variables_map& vm) {
  try {
    po::store(po::command_line_parser(argc, argv).options(options).run(), vm);
    if (vm.count("config") != 0) {
      const std::string path = vm["config"].as<std::string>();
      std::ifstream file(path);
      MGBENCH_REQUIRE(file.good(), ConfigError, "--config {}: cannot open the file", path);
      try {
        po::store(po::parse_config_file(file, options), vm);
      } catch (const po::error& e) {
        throw ConfigError(fmt::format("--config {}: {}", path, e.what()));
      }
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError(e.what());
  }
}

std::string to_ini(const po::variables_map& vm, const std::string& skip) {
  std::ostringstream out;
  const std::string skipped = "," + skip + ",config,help,";
  for (const auto& [name, value] : vm) {
    if (skipped.find("," + name + ",") != std::string::npos || value.empty()) continue;
    const auto& v = value.value();
    std::string text;
    if (const auto* s = boost::any_cast<std::string>(&v)) {
      text = *s;
    } else if (const auto* b = boost::any_cast<bool>(&v)) {
      text = *b ? "true" : "false";
    } else if (const auto* i = boost::any_cast<std::int64_t>(&v)) {
      text = std::to_string(*i);
    } else if (const auto* u = boost::any_cast<std::uint64_t>(&v)) {
      text = std::to_string(*u);
    } else if (const auto* n = boost::any_cast<int>(&v)) {
      text = std::to_string(*n);
    } else if (const auto* d = boost::any_cast<double>(&v)) {
      text = fmt::format("{:g}", *d);
    } else {
      continue;
    }
    out << name << " = " << text << "\n";
  }
  return out.str();
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
