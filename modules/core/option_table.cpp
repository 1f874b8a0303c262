#include "core/option_table.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/ini_lines.h"

namespace mgbench::options {
namespace {

template <typename I>
I parse_integer(std::string_view option, const std::string& text, std::string_view expected) {
  I value{};
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) fail(option, text, expected);
  return value;
}

// The run attribute of an option: its name with '-' as '_'.
std::string attribute_name(std::string option) {
  std::replace(option.begin(), option.end(), '-', '_');
  return option;
}

}  // namespace

std::string join_names(const std::vector<std::string_view>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

void fail(std::string_view option, std::string_view text, std::string_view expected) {
  throw ConfigError(fmt::format("--{} '{}': expected {}", option, text, expected));
}

void fail_operand(std::string_view value_name, std::string_view text, std::string_view expected) {
  throw ConfigError(fmt::format("{} '{}': expected {}", value_name, text, expected));
}

void add_only_with(Option& option, std::function<bool()> applies, std::string when) {
  if (option.applies) throw std::logic_error("option --" + option.name + ": only_with given twice");
  option.applies = std::move(applies);
  option.applies_with = std::move(when);
}

std::string to_text(const std::string& v) { return v; }
std::string to_text(bool v) { return v ? "true" : "false"; }
std::string to_text(int v) { return std::to_string(v); }
std::string to_text(std::int64_t v) { return std::to_string(v); }
std::string to_text(std::uint64_t v) { return std::to_string(v); }
std::string to_text(double v) { return fmt::format("{}", v); }
std::string to_text(const std::vector<std::int64_t>& v) { return fmt::format("{}", fmt::join(v, ",")); }
std::string to_text(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

void from_text(std::string_view, const std::string& text, std::string& out) { out = text; }

void from_text(std::string_view option, const std::string& text, bool& out) {
  if (text == "true" || text == "1" || text == "yes" || text == "on") {
    out = true;
  } else if (text == "false" || text == "0" || text == "no" || text == "off") {
    out = false;
  } else {
    fail(option, text, "true or false");
  }
}

void from_text(std::string_view option, const std::string& text, int& out) {
  out = parse_integer<int>(option, text, "an integer");
}
void from_text(std::string_view option, const std::string& text, std::int64_t& out) {
  out = parse_integer<std::int64_t>(option, text, "an integer");
}
void from_text(std::string_view option, const std::string& text, std::uint64_t& out) {
  out = parse_integer<std::uint64_t>(option, text, "an integer >= 0");
}

void from_text(std::string_view option, const std::string& text, double& out) {
  // strtod: also "1e-4" and "inf" (refused below); from_chars for doubles needs GCC 11's libstdc++.
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v)) {
    fail(option, text, "a finite number");
  }
  out = v;
}

void from_text(std::string_view option, const std::string& text, std::vector<std::string>& out) {
  out.clear();
  std::stringstream list(text);
  for (std::string item; std::getline(list, item, ',');) {
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) out.push_back(item);
  }
}

void from_text(std::string_view option, const std::string& text, std::vector<std::int64_t>& out) {
  std::vector<std::string> items;
  from_text(option, text, items);
  out.clear();
  for (const auto& item : items) {
    std::int64_t v = 0;
    const char* end = item.data() + item.size();
    const auto [ptr, ec] = std::from_chars(item.data(), end, v);
    if (ec != std::errc() || ptr != end) fail(option, text, "comma-separated integers");
    out.push_back(v);
  }
}

Value to_value(const std::string& v) { return v; }
Value to_value(bool v) { return to_text(v); }
Value to_value(int v) { return static_cast<std::int64_t>(v); }
Value to_value(std::int64_t v) { return v; }
Value to_value(std::uint64_t v) { return static_cast<std::int64_t>(v); }
Value to_value(double v) { return v; }
Value to_value(const std::vector<std::string>& v) { return to_text(v); }
Value to_value(const std::vector<std::int64_t>& v) { return to_text(v); }

std::string_view value_name(const std::string&) { return "TEXT"; }
std::string_view value_name(bool) { return "true|false"; }
std::string_view value_name(int) { return "N"; }
std::string_view value_name(std::int64_t) { return "N"; }
std::string_view value_name(std::uint64_t) { return "N"; }
std::string_view value_name(double) { return "X"; }
std::string_view value_name(const std::vector<std::string>&) { return "A,B,..."; }
std::string_view value_name(const std::vector<std::int64_t>&) { return "N,M,..."; }

Option& OptionTable::declare(std::string name, std::string help, std::string value_name) {
  if (find(name) != nullptr) throw std::logic_error("option --" + name + " declared twice");
  Option& o = options_.emplace_back();
  o.name = std::move(name);
  o.section = section_;
  o.help = std::move(help);
  o.value_name = std::move(value_name);
  return o;
}

Option* OptionTable::find(std::string_view name) {
  for (auto& o : options_) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

const Option* OptionTable::find(std::string_view name) const { return const_cast<OptionTable*>(this)->find(name); }

void OptionTable::only_with(std::string_view name, std::function<bool()> applies, std::string when) {
  Option* o = find(name);
  if (o == nullptr) throw std::out_of_range("undeclared option --" + std::string(name));
  add_only_with(*o, std::move(applies), std::move(when));
}

void OptionTable::set(std::string_view name, const std::string& text) {
  Option* o = find(name);
  if (o == nullptr) throw std::out_of_range("undeclared option --" + std::string(name));
  o->parse(text);
  o->given = true;
}

void OptionTable::append(std::string_view name, const std::string& item) {
  Option* o = find(name);
  if (o == nullptr) throw std::out_of_range("undeclared option --" + std::string(name));
  if (!o->append) return set(name, item);
  if (!o->given) o->parse("");  // the first item replaces the default list
  o->append(item);
  o->given = true;
}

void OptionTable::set_defaults(std::string_view ini) {
  std::istringstream lines{std::string(ini)};
  std::string settings;
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with('#')) continue;  // a comment, as in --config files (Boost's parse_config_file)
    if (!line.empty() && line.find(" = ") == std::string::npos) {
      throw std::logic_error("defaults: '" + line + "' is not a `name = value` line");
    }
    settings += line + "\n";
  }
  for (const auto& [name, text] : ini_lines(settings)) {
    Option* o = find(name);
    if (o == nullptr) throw std::out_of_range("undeclared option --" + name);
    if (!o->given) {
      o->parse(text);
      o->default_text = o->text();
    }
  }
}

void OptionTable::validate(bool dry_run) const {
  for (const auto& o : options_) {
    if (o.required && !o.given && !(dry_run && o.planned_without)) {
      const std::string what = o.help.substr(0, o.help.find('\n'));
      // Operands have no option name to point at: say what is missing.
      if (o.positional != 0) throw ConfigError(fmt::format("no {} given: {}", o.value_name, what));
      throw ConfigError(fmt::format("--{}: required ({})", o.name, what));
    }
    for (const auto& check : o.checks) check();
    if (o.applies && o.given && (o.on_command_line || o.text() != o.default_text) && !o.applies()) {
      throw ConfigError(fmt::format("--{} '{}': only with {}", o.name, o.text(), o.applies_with));
    }
  }
}

void OptionTable::reset_unused() {
  for (auto& o : options_) {
    if (o.applies && o.text() != o.default_text && !o.applies()) o.parse(o.default_text);
  }
}

std::string OptionTable::ini() const {
  std::string out;
  for (const auto& o : options_) out += o.name + " = " + o.text() + "\n";
  return out;
}

std::string OptionTable::identity() const {
  std::string out;
  for (const auto& o : options_) {
    if (o.effect != Effect::kNone) out += o.name + " = " + o.text() + "\n";
  }
  return out;
}

std::vector<std::pair<std::string, Value>> OptionTable::attributes() const {
  std::vector<std::pair<std::string, Value>> out;
  for (const auto& o : options_) out.emplace_back(attribute_name(o.name), o.value());
  return out;
}

std::vector<std::string> OptionTable::workload_attributes() const {
  std::vector<std::string> out;
  for (const auto& o : options_) {
    if (o.effect == Effect::kWorkload) out.push_back(attribute_name(o.name));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> ini_lines(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto eq = line.find(" = ");
    if (eq != std::string::npos) out.emplace_back(line.substr(0, eq), line.substr(eq + 3));
  }
  return out;
}

std::vector<std::string> differences(const std::string& a, const std::string& b) {
  const auto left = ini_lines(a);
  const auto right = ini_lines(b);
  const std::map<std::string, std::string> right_map(right.begin(), right.end());
  std::map<std::string, std::string> left_map(left.begin(), left.end());
  std::vector<std::string> out;
  for (const auto& [key, value] : left) {
    const auto it = right_map.find(key);
    const std::string other = it == right_map.end() ? "(none)" : it->second;
    if (other != value) out.push_back(fmt::format("--{}: {} -> {}", key, value, other));
  }
  for (const auto& [key, value] : right) {
    if (left_map.count(key) == 0) out.push_back(fmt::format("--{}: (none) -> {}", key, value));
  }
  return out;
}

std::string config_id(std::string_view identity) {
  const uLong crc =
      crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(identity.data()), static_cast<uInt>(identity.size()));
  return fmt::format("{:08x}", static_cast<std::uint32_t>(crc));
}

}  // namespace mgbench::options
