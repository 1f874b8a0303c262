// mgbench: how machine-learning jobs use multi-GPU nodes. One row per command below: its name, what
// it does (the usage text is made of these rows) and its function: the MPI commands' in files of
// their own (cmd_*.cpp), the others' a call of their module on its parsed options (options.h).
#include <iostream>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "commands.h"
#include "core/build_info.h"
#include "data/image_tools.h"
#include "data/text/tools.h"
#include "models/qat_convert.h"
#include "options.h"
#include "report/commands.h"
#include "runtime/stop_request.h"

namespace {

using namespace mgbench;
using app::run_command;

struct Command {
  std::string_view name;
  std::string_view help;
  int (*main)(int argc, char** argv);
  /// Its ranks stop at a step boundary (comm: between sizes) on SIGTERM / SIGUSR1
  /// (runtime/stop_request.h), with the handlers installed before anything else runs (below).
  bool stops_on_signals = false;
};

constexpr Command kCommands[] = {
    {"image",
     "image classification across MPI ranks: MobileNetV2 / ResNet-50 on MNIST upscaled to --image-size px\n"
     "or on JPEG / PNG files (--dataset imagefolder)\n"
     "(strategies ddp, ddp-rr, ddp-ds, dp; fp64 ... amp-bf16); per-rank timings into HDF5",
     &mgbench::app::image_main, true},
    {"llm",
     "LLM fine-tuning across MPI ranks: Llama 3 with TorchTune's recipe semantics (--recipe lora,\n"
     "qlora, dpo, full, qat, qat-lora), --eval-only for a loss",
     &mgbench::app::llm_main, true},
    {"comm",
     "collective benchmark in nccl-tests' manner (all-reduce, all-gather, reduce-scatter,\n"
     "broadcast) over the Communicator training uses: MPI on CPUs, NCCL on GPUs",
     &mgbench::app::comm_main, true},
    {"predict",
     "time, speed-up and limiting phase of measured workloads at other rank counts and strategies\n"
     "(from a 1-rank run and a comm run; written as `prediction` runs)",
     &mgbench::app::predict_main},
    {"quantize", "a QAT-trained checkpoint's fake-quantised linears -> int4 weights (torchao's convert)",
     [](int argc, char** argv) {
       return run_command<models::QuantizeOptions>(
           {"quantize", models::QuantizeOptions::kUsage}, argc, argv,
           [](const models::QuantizeOptions& o) { return models::quantize(o, std::cout, std::cerr); });
     }},
    {"report", "tables of one or more results files (paper Table 2 style; --phases, --cuda, --csv, --plot)",
     &mgbench::app::report_main},
    {"tokenize", "UTF-8 text on stdin -> Llama 3 token ids on stdout (tiktoken BPE)",
     [](int argc, char** argv) {
       return run_command<text::TokenizeOptions>(
           {"tokenize", text::TokenizeOptions::kUsage}, argc, argv,
           [](const text::TokenizeOptions& o) { return text::tokenize(o, std::cin, std::cout, std::cerr); });
     }},
    {"data",
     "`data stats`: rows and token lengths of a fine-tuning dataset; `data make-images`: MNIST as an\n"
     "ImageFolder of JPEG / PNG files at a given size; `data read-images`: the image loader alone (img/s)",
     [](int argc, char** argv) {
       const std::string_view first = argc > 1 ? argv[1] : "";
       if (first == "--help" || first == "-h") {
         std::cout << text::DatasetStatsOptions::kUsage << "\n\n"
                   << data::MakeImagesOptions::kUsage << "\n\n"
                   << data::ReadImagesOptions::kUsage << "\n\n(mgbench data <subcommand> --help: its options)\n";
         return 0;
       }
       // The subcommand first (was: anything else read as `stats`, "ACTION 'make-images': expected stats").
       if (first != "stats" && first != "make-images" && first != "read-images") {
         std::cerr << "mgbench data: " << (first.empty() ? "no subcommand" : fmt::format("'{}'", first))
                   << ": expected a subcommand first: stats, make-images or read-images (mgbench data --help)\n";
         return 2;
       }
       if (first == "read-images") {
         return run_command<data::ReadImagesOptions>(
             {"data", data::ReadImagesOptions::kUsage}, argc, argv,
             [](const data::ReadImagesOptions& o) { return data::read_images(o, std::cout, std::cerr); });
       }
       if (first == "make-images") {
         return run_command<data::MakeImagesOptions>(
             {"data", data::MakeImagesOptions::kUsage}, argc, argv,
             [](const data::MakeImagesOptions& o) { return data::make_images(o, std::cout, std::cerr); });
       }
       return run_command<text::DatasetStatsOptions>(
           {"data", text::DatasetStatsOptions::kUsage}, argc, argv,
           [](const text::DatasetStatsOptions& o) { return text::dataset_stats(o, std::cout, std::cerr); });
     }},
};

std::string usage() {
  std::string text = "usage: mgbench <command> [options]\n\ncommands:\n";
  for (const auto& c : kCommands) {
    std::string help(c.help);
    for (std::size_t at = help.find('\n'); at != std::string::npos; at = help.find('\n', at + 1)) {
      help.insert(at + 1, 11, ' ');  // continuation lines under the first
    }
    text += "  " + std::string(c.name) + std::string(9 - c.name.size(), ' ') + help + "\n";
  }
  return text +
         "\n  mgbench <command> --help   options of a command\n"
         "  mgbench --version          version and git commit\n"
         "launch: mpirun -np N mgbench image --data DIR ...   (one rank per GPU, or per CPU slot;\n"
         "        SLURM: slurm/image.sbatch, slurm/llm.sbatch)\n";
}

/// Called from the executable's .preinit_array, before any shared library's initialisers (LibTorch's
/// take ~0.4 s of a rank's start, during which a stop signal would kill the rank by its default
/// action, exit 138, nothing said): SLURM's or an operator's SIGUSR1 / SIGTERM sent to mpirun right
/// after launch reaches the ranks as a stop during set-up (exit 75 with a message). Only the dynamic
/// loader's mapping (~10 ms) comes before it.
void install_stop_handlers_first(int argc, char** argv, char** /*envp*/) {
  if (argc < 2) return;
  for (const auto& c : kCommands) {
    if (c.stops_on_signals && c.name == argv[1]) runtime::install_stop_handlers();
  }
}

[[gnu::used,
  gnu::section(".preinit_array")]] void (*const kInstallStopHandlersFirst)(int, char**,
                                                                           char**) = &install_stop_handlers_first;

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << usage();
    return 2;
  }
  const std::string command = argv[1];
  if (command == "-h" || command == "--help" || command == "help") {
    std::cout << usage();
    return 0;
  }
  if (command == "--version") {
    std::cout << "mgbench " << mgbench::build_info::kVersion << " (" << mgbench::build_info::kGitCommit << ", "
              << mgbench::build_info::kBuildType << ", " << mgbench::build_info::kCompiler << ")\n";
    return 0;
  }
  for (const auto& c : kCommands) {
    if (c.name == command) return c.main(argc - 1, argv + 1);
  }
  std::cerr << "mgbench: unknown command '" << command << "'\n\n" << usage();
  return 2;
}
