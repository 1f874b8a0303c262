// --config files (INI, Boost.Program_options' format) into an option table of every value type
// mgbench's options have: integers and doubles with bounds, switches, text, lists, an enumeration.
// The first byte picks which options the command line sets too (the command line wins).
#include <array>
#include <vector>

#include "core/option_table.h"
#include "fuzz_support.h"
#include "options.h"

namespace {

enum class Mode { kA, kB };
constexpr mgbench::options::Choice<Mode> kModes[] = {{"a", Mode::kA, "mode a"}, {"b", Mode::kB, "mode b"}};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string path = mgbench::fuzz::write_input(data + 1, size - 1, "config.ini");
  std::int64_t epochs = 1;
  int threads = 0;
  std::uint64_t seed = 0;
  double lr = 1e-3;
  bool shuffle = false;
  std::string name = "run";
  std::vector<std::string> targets = {"q_proj"};
  Mode mode = Mode::kA;
  mgbench::options::OptionTable table;
  table.add("epochs", epochs, "epochs").at_least(1);
  table.add("threads", threads, "threads").at_least(0).at_most(4096);
  table.add("seed", seed, "seed");
  table.add("lr", lr, "learning rate").above(0.0);
  table.add("shuffle", shuffle, "shuffle");
  table.add("run-name", name, "name");
  table.add("lora-targets", targets, "targets");
  table.add("mode", mode, std::span<const mgbench::options::Choice<Mode>>(kModes), "mode");
  std::vector<std::string> args = {"fuzz", "--config", path};
  if ((data[0] & 1) != 0) args.insert(args.end(), {"--epochs", "3"});
  if ((data[0] & 2) != 0) args.insert(args.end(), {"--mode", "b"});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  mgbench::fuzz::expect_clean_errors([&] {
    namespace po = boost::program_options;
    po::options_description options;
    mgbench::app::describe(table, options);
    options.add_options()("config", po::value<std::string>(), "configuration file");
    po::variables_map vm;
    mgbench::app::parse(static_cast<int>(argv.size()), argv.data(), options, vm);
    mgbench::app::apply_values(vm, table);
    table.validate();
    if ((data[0] & 1) != 0 && epochs != 3) __builtin_trap();  // the command line wins
    (void)table.ini();
    (void)table.attributes();
  });
  return 0;
}
