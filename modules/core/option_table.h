#pragma once
// Typed option tables. Every option of a job command is declared once, by the component that
// uses it, as a row of an OptionTable: its name, --help section and text, the typed field it
// fills, its bounds, and whether it changes what a run computes. Everything else comes from the
// table: the --help text, parsing (once, at the boundary, into the typed field), validation, the
// resolved configuration as INI text (readable again with --config), the run attributes, and the
// checkpoint identity (the INI lines of the settings that change results).
//
// Enumerated options ("axes": strategy, precision, device, backend, dataset, recipe, ...) are
// descriptor tables of Choice rows -- the name users type, the enum value, one line of help -- in
// the manner of nccl-tests' `struct testColl`: a new value is one new row.
//
// No Boost here: app/ turns a table into Boost.Program_options descriptions and hands the parsed
// text back through set().
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace mgbench::options {

/// One value of an enumerated option. Descriptor tables may use richer rows (a precision's
/// dtypes, a strategy's properties): any type with the members name, value and help serves.
template <typename E>
struct Choice {
  std::string_view name;  // as typed on the command line
  E value;
  std::string_view help;  // one line
};

/// The enum type of a descriptor row.
template <typename Row>
using ValueOf = std::remove_cvref_t<decltype(std::declval<const Row&>().value)>;

/// "a, b or c".
std::string join_names(const std::vector<std::string_view>& names);

template <typename Row>
std::vector<std::string_view> names_of(std::span<const Row> rows) {
  std::vector<std::string_view> names;
  for (const auto& r : rows) names.push_back(r.name);
  return names;
}

/// The row of value. A value without a row is a programming error: std::logic_error.
template <typename Row>
const Row& row_of(std::span<const Row> rows, ValueOf<Row> value) {
  for (const auto& r : rows) {
    if (r.value == value) return r;
  }
  throw std::logic_error("a descriptor table misses a value");
}

/// The name of value in rows.
template <typename Row>
std::string_view name_of(std::span<const Row> rows, ValueOf<Row> value) {
  return row_of(rows, value).name;
}

/// Throws ConfigError "--<option> '<text>': expected <what>".
[[noreturn]] void fail(std::string_view option, std::string_view text, std::string_view expected);
/// The same for an operand (a positional option, named by its value name): "<NAME> '<text>': expected <what>".
[[noreturn]] void fail_operand(std::string_view value_name, std::string_view text, std::string_view expected);

/// The value named text; throws ConfigError "--<option> '<text>': expected a, b or c".
template <typename Row>
ValueOf<Row> parse_choice(std::span<const Row> rows, std::string_view option, std::string_view text) {
  for (const auto& r : rows) {
    if (r.name == text) return r.value;
  }
  fail(option, text, join_names(names_of(rows)));
}

/// What a setting changes, the fact that places it in the two identities:
/// - kWorkload: what is computed and on what it runs (the model, its shape, precision, batch, data
///   layout and decoding, the device): part of the workload identity -- the run attributes by which
///   `report`, `--reference`, `predict` and mgbench_analysis pair runs as one workload -- and of the
///   checkpoint identity. Every option is this unless its row says otherwise, so an option added and
///   not thought about splits workloads rather than pairing unlike runs (and shows in the generated
///   list, python/mgbench_analysis/workload_identity.txt, whose test then fails until regenerated).
/// - kResult: the numbers or the measurement, not the work (the seed, the learning rate, thread and
///   bucket counts, the strategy and backend the reports compare along): the checkpoint identity only.
/// - kNone: neither -- where results and checkpoints go, how often progress is printed or
///   checkpoints written, the watchdog, the profiling switches: a run may be resumed with other values.
enum class Effect { kWorkload, kResult, kNone };

/// A typed value (run attributes): text, a 64-bit integer or a double.
using Value = std::variant<std::string, std::int64_t, double>;

// Text <-> value of the field types an option can have. Parsing throws ConfigError naming the
// option and what was expected; formatting is exact (doubles: the shortest text that reads back
// to the same double).
std::string to_text(const std::string& v);
std::string to_text(bool v);
std::string to_text(int v);
std::string to_text(std::int64_t v);
std::string to_text(std::uint64_t v);
std::string to_text(double v);
std::string to_text(const std::vector<std::string>& v);   // comma-separated
std::string to_text(const std::vector<std::int64_t>& v);  // comma-separated
void from_text(std::string_view option, const std::string& text, std::string& out);
void from_text(std::string_view option, const std::string& text, bool& out);  // true|false (1|0, yes|no, on|off)
void from_text(std::string_view option, const std::string& text, int& out);
void from_text(std::string_view option, const std::string& text, std::int64_t& out);
void from_text(std::string_view option, const std::string& text, std::uint64_t& out);
void from_text(std::string_view option, const std::string& text, double& out);  // finite
void from_text(std::string_view option, const std::string& text, std::vector<std::string>& out);
void from_text(std::string_view option, const std::string& text, std::vector<std::int64_t>& out);
Value to_value(const std::string& v);
Value to_value(bool v);  // "true" / "false" (HDF5 has no boolean)
Value to_value(int v);
Value to_value(std::int64_t v);
Value to_value(std::uint64_t v);
Value to_value(double v);
Value to_value(const std::vector<std::string>& v);
Value to_value(const std::vector<std::int64_t>& v);
std::string_view value_name(const std::string&);
std::string_view value_name(bool);
std::string_view value_name(int);
std::string_view value_name(std::int64_t);
std::string_view value_name(std::uint64_t);
std::string_view value_name(double);
std::string_view value_name(const std::vector<std::string>&);
std::string_view value_name(const std::vector<std::int64_t>&);

/// One declared option (type-erased; OptionTable::add builds it).
struct Option {
  std::string name;              // long name without dashes: "batch-size"
  std::string section;           // its --help section
  std::string help;              // the help text, with the choices of an enumeration appended
  std::string value_name;        // "N", "X", "S", "true|false", "ddp|ddp-rr|..."
  bool is_switch = false;        // given without a value: --resume
  bool required = false;         // no usable default: must be given
  bool planned_without = false;  // required to run, not by --dry-run's plan (which reads no input)
  int positional = 0;            // given without its name, as the command's operands: at most this many
                                 // (-1: all the remaining); 0: by name only
  bool repeatable = false;       // a list whose name may be given several times, one item each (--comm A --comm B)
  Effect effect = Effect::kWorkload;
  bool given = false;                              // set from the command line or a config file
  bool on_command_line = false;                    // ... and typed on the command line (app::apply_values)
  std::string default_text;                        // the value when not given: declared, or a recipe's default
  std::function<bool()> applies;                   // Declared::only_with: whether the run uses it (empty: always)
  std::string applies_with;                        // ... and what it needs: "--finetune lora"
  std::function<std::string()> text;               // the current value, exact
  std::function<Value()> value;                    // the current value, typed
  std::function<void(const std::string&)> parse;   // text -> field; throws ConfigError naming the option
  std::function<void(const std::string&)> append;  // one more item of a list (positional or repeatable ones)
  std::vector<std::function<void()>> checks;       // bounds; each throws ConfigError naming the option
  std::string named;                               // the named value given (Declared::named_value), if any
};

/// Declared::only_with on option. Throws std::logic_error for an option that has it already.
void add_only_with(Option& option, std::function<bool()> applies, std::string when);

/// What OptionTable::add returns: bounds and properties of the option just declared.
template <typename T>
class Declared {
 public:
  Declared(Option& option, T& field) : option_(option), field_(field) {}

  /// value >= lo (and the others alike). The error names the option, the value and the bound.
  Declared& at_least(T lo) {
    return bound([lo](const T& v) { return v >= lo; }, ">= " + to_text(lo));
  }
  Declared& above(T lo) {
    return bound([lo](const T& v) { return v > lo; }, "> " + to_text(lo));
  }
  Declared& at_most(T hi) {
    return bound([hi](const T& v) { return v <= hi; }, "<= " + to_text(hi));
  }
  Declared& below(T hi) {
    return bound([hi](const T& v) { return v < hi; }, "< " + to_text(hi));
  }
  /// Any predicate, with what the option expects: .check(valid_window, "START:DURATION or all").
  Declared& check(std::function<bool(const T&)> ok, std::string expected) { return bound(std::move(ok), expected); }
  /// Given, a value that is not empty; left out, its default (empty: off). `--reference ""`, a
  /// nightly job's unset variable, compared nothing and passed.
  Declared& not_empty_when_given(std::string expected) {
    return bound([&o = option_](const T& v) { return !o.given || !v.empty(); }, std::move(expected));
  }
  /// A word the option takes besides its type's values, standing for `value` (outside the bounds):
  /// `--image-size native` is 0 until the recipe resolves it. Parsed, shown and recorded as the word
  /// while the field holds `value`.
  Declared& named_value(std::string word, T value) {
    option_.value_name += "|" + word;
    option_.parse = [parse = std::move(option_.parse), word, value, &field = field_,
                     &o = option_](const std::string& text) {
      if (text == word) {
        field = value;
        o.named = word;
      } else {
        o.named.clear();
        parse(text);  // the value itself, typed as a number, is bounded as any other
      }
    };
    const auto holds_word = [word, value, &field = field_, &o = option_] { return o.named == word && field == value; };
    option_.text = [text = std::move(option_.text), word, holds_word] { return holds_word() ? word : text(); };
    option_.value = [typed = std::move(option_.value), word, holds_word] {
      return holds_word() ? Value(word) : typed();
    };
    return *this;
  }
  /// An option of some runs only: where `applies()` is false (read at validation, every option
  /// parsed), the option typed on the command line (even at its default) or set to another value
  /// than its default in a config file refuses the run -- ConfigError "--crop 'center': only with
  /// --dataset imagefolder or webdataset" -- rather than the value silently ignored. A run's
  /// resolved configuration (ini(), read back with --config) lists every option, such ones at their
  /// defaults, and passes.
  Declared& only_with(std::function<bool()> applies, std::string when) {
    add_only_with(option_, std::move(applies), std::move(when));
    return *this;
  }
  /// A unit the value may be written with, dropped before parsing: `--tolerance 10%` reads as 10.
  Declared& accepts_suffix(std::string suffix) {
    option_.parse = [parse = std::move(option_.parse), suffix = std::move(suffix)](const std::string& text) {
      parse(text.size() > suffix.size() && text.ends_with(suffix) ? text.substr(0, text.size() - suffix.size()) : text);
    };
    return *this;
  }
  /// A setting that does not change results (in neither identity): Effect::kNone.
  Declared& no_effect() {
    option_.effect = Effect::kNone;
    return *this;
  }
  /// A setting that changes the numbers or the measurement but not the workload (in the checkpoint
  /// identity, not the workload identity): Effect::kResult.
  Declared& same_workload() {
    option_.effect = Effect::kResult;
    return *this;
  }
  /// Given without a value (bool fields only): --resume.
  Declared& as_switch() {
    option_.is_switch = true;
    return *this;
  }
  /// Must be given (its default is unusable): --output.
  Declared& required() {
    option_.required = true;
    return *this;
  }
  /// Must be given to run, not for --dry-run's plan, which reads no input: llm's --data.
  Declared& required_to_run() {
    option_.required = true;
    option_.planned_without = true;
    return *this;
  }
  Declared& value_name(std::string name) {
    option_.value_name = std::move(name);
    return *this;
  }
  /// Given without its name, as operands (`mgbench report FILE...`): up to max_count tokens
  /// (-1: every remaining one). A list takes one item per token.
  Declared& positional(int max_count = -1) {
    option_.positional = max_count;
    return *this;
  }
  /// A list given as one item per occurrence of its name (--comm A --comm B), commas kept.
  Declared& repeatable() {
    static_assert(std::is_same_v<T, std::vector<std::string>>, "repeatable: lists of text only");
    option_.repeatable = true;
    return *this;
  }

 private:
  Declared& bound(std::function<bool(const T&)> ok, std::string expected) {
    option_.checks.push_back([ok = std::move(ok), expected = std::move(expected), &field = field_, &o = option_] {
      if (ok(field) || (!o.named.empty() && o.text() == o.named)) return;
      if (o.positional != 0) fail_operand(o.value_name, o.text(), expected);
      fail(o.name, o.text(), expected);
    });
    return *this;
  }
  Option& option_;
  T& field_;
};

class OptionTable {
 public:
  OptionTable() = default;
  // The rows' closures refer to the rows and to the declared fields: a copy would parse into the
  // original. Moving keeps the rows where they are (a deque's elements do not move with it).
  OptionTable(const OptionTable&) = delete;
  OptionTable& operator=(const OptionTable&) = delete;
  OptionTable(OptionTable&&) = default;
  OptionTable& operator=(OptionTable&&) = default;

  /// The options declared after this go into the --help section `title`.
  void section(std::string title) { section_ = std::move(title); }

  /// Declares --name, filling field (its current value is the default). T: std::string, bool,
  /// int, std::int64_t, std::uint64_t, double, std::vector<std::string> (comma-separated).
  /// Throws std::logic_error for a name declared twice.
  template <typename T>
  Declared<T> add(std::string name, T& field, std::string help) {
    Option& o = declare(std::move(name), std::move(help), std::string(options::value_name(field)));
    o.text = [&field] { return to_text(field); };
    o.value = [&field] { return to_value(field); };
    o.parse = [&field, &o](const std::string& text) { from_text(o.name, text, field); };
    o.default_text = o.text();
    if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      o.append = [&field](const std::string& item) { field.push_back(item); };
    }
    return Declared<T>(o, field);
  }

  /// Declares a list of an enumerated option's values, comma-separated names of rows.
  template <typename Row>
  Declared<std::vector<ValueOf<Row>>> add(std::string name, std::vector<ValueOf<Row>>& field, std::span<const Row> rows,
                                          std::string help) {
    std::string names;
    for (const auto& r : rows) {
      names += (names.empty() ? "" : ",") + std::string(r.name);
      help += "\n  " + std::string(r.name) + ": " + std::string(r.help);
    }
    Option& o = declare(std::move(name), std::move(help), names);
    o.text = [&field, rows] {
      std::string text;
      for (const auto v : field) text += (text.empty() ? "" : ",") + std::string(name_of(rows, v));
      return text;
    };
    o.default_text = o.text();
    o.value = [&o] { return Value(o.text()); };
    o.parse = [&field, rows, &o](const std::string& text) {
      std::vector<std::string> items;
      from_text(o.name, text, items);
      field.clear();
      for (const auto& item : items) {
        // The whole list in the message: "--strategies 'ddp,fsdp': expected ddp, ddp-rr, ..."
        bool known = false;
        for (const auto& r : rows) known = known || r.name == item;
        if (!known) fail(o.name, text, join_names(names_of(rows)));
        field.push_back(parse_choice(rows, o.name, item));
      }
    };
    return Declared<std::vector<ValueOf<Row>>>(o, field);
  }

  /// Declares an enumerated option: its text is the name of one of rows (a descriptor table:
  /// Choice rows, or any rows with name, value and help), each listed in --help.
  template <typename Row>
  Declared<ValueOf<Row>> add(std::string name, ValueOf<Row>& field, std::span<const Row> rows, std::string help) {
    std::string names;
    for (const auto& r : rows) {
      names += (names.empty() ? "" : "|") + std::string(r.name);
      help += "\n  " + std::string(r.name) + ": " + std::string(r.help);
    }
    Option& o = declare(std::move(name), std::move(help), names);
    o.text = [&field, rows] { return std::string(name_of(rows, field)); };
    o.default_text = o.text();
    o.value = [&field, rows] { return Value(std::string(name_of(rows, field))); };
    o.parse = [&field, rows, &o](const std::string& text) { field = parse_choice(rows, o.name, text); };
    return Declared<ValueOf<Row>>(o, field);
  }

  /// Declared::only_with for --name, declared by another component: a recipe that has no use for a
  /// shared option in some of its runs (sft's --eval-only writes no --output-dir). Throws
  /// std::out_of_range for an undeclared name.
  void only_with(std::string_view name, std::function<bool()> applies, std::string when);

  std::deque<Option>& options() { return options_; }
  const std::deque<Option>& options() const { return options_; }
  /// The option named name, or nullptr.
  Option* find(std::string_view name);
  const Option* find(std::string_view name) const;

  /// Sets --name from text (the command line or a config file). Throws ConfigError naming the
  /// option for a bad value, std::out_of_range for an undeclared name.
  void set(std::string_view name, const std::string& text);
  /// Adds one item to the list --name (a positional or repeatable option): the first replaces the
  /// default. Other options: as set(). Throws as set().
  void append(std::string_view name, const std::string& item);
  /// Sets the defaults of several options from "name = value" lines (--config's format): those not
  /// given (on the command line or in a config file) take these values, their defaults from then
  /// on (Declared::only_with); lines starting with '#' are comments, as in --config files. Throws as set(), and
  /// std::logic_error for another line that is not "name = value".
  void set_defaults(std::string_view ini);
  /// Checks every option: given where required (for a --dry-run, dry_run: not those only a run
  /// needs), within its bounds, used by the run where given (Declared::only_with). Throws
  /// ConfigError naming the first invalid option and what it expects.
  void validate(bool dry_run = false) const;
  /// Sets each option the run does not use (Declared::only_with) back to its default: a recorded
  /// configuration read back (`predict` of a run written before the option was refused there), whose
  /// such values had no effect on the run.
  void reset_unused();

  /// "name = value" lines of every option, in declaration order: the resolved configuration,
  /// readable with --config.
  std::string ini() const;
  /// ini() of the options that change results (Effect::kWorkload and kResult): what identifies a
  /// run's results (config_id names it).
  std::string identity() const;
  /// The run attribute names (attributes()) of the options in the workload identity
  /// (Effect::kWorkload), in declaration order.
  std::vector<std::string> workload_attributes() const;
  /// Every option as a run attribute: name with '-' as '_', the typed value.
  std::vector<std::pair<std::string, Value>> attributes() const;

 private:
  Option& declare(std::string name, std::string help, std::string value_name);

  std::deque<Option> options_;  // a deque: Declared and the closures keep references to rows
  std::string section_ = "Options";
};

/// The CRC-32 (zlib's) of an identity text (OptionTable::identity, plus what a job adds to it) as
/// 8 hex digits: the run attribute config_id and the name of a configuration's checkpoint directory.
std::string config_id(std::string_view identity);

/// The settings in which two identity texts (OptionTable::identity) differ, as
/// "--name: <a> -> <b>" (a missing setting shows as "(none)"), in the order of `a`, then b's own.
std::vector<std::string> differences(const std::string& a, const std::string& b);

}  // namespace mgbench::options
