// `mgbench quantize`: a QAT-trained checkpoint's fake-quantised linears -> real int4 weights
// (torchao's convert; layout in models/qat_convert.h and docs/quantization.md).
#include <iostream>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "commands.h"
#include "core/error.h"
#include "models/qat_convert.h"
#include "options.h"

namespace mgbench::app {

int quantize_main(int argc, char** argv) {
  std::string model, adapter, output;
  po::options_description options(
      "mgbench quantize: convert what a QAT run trained (--recipe qat, or qat-lora) to int4 weights with per-group "
      "scales, as torchao's Int8DynActInt4WeightQATQuantizer.convert.\n"
      "usage: mgbench quantize --model DIR [--adapter DIR] --output DIR\n");
  options.add_options()("model", po::value(&model)->required(),
                        "Hugging Face checkpoint: a qat run's --output-dir, or the base model of a qat-lora run")(
      "adapter", po::value(&adapter), "a qat-lora run's --output-dir (adapters merged into --model first)")(
      "output", po::value(&output)->required(), "directory for model.safetensors, config.json, qat_config.json")(
      "help,h", "show this help");
  po::variables_map vm;
  if (const std::optional<int> exit_code = parse_tool_options("quantize", argc, argv, options, vm)) return *exit_code;
  try {
    const models::QatConvertResult r = models::convert_qat_checkpoint(model, adapter, output);
    constexpr double kMiB = 1024.0 * 1024.0;
    std::cout << fmt::format(
        "quantize: {} linears to int4 (groups of {}): {:.2f} MiB -> {:.2f} MiB ({:.3f} of their bytes); {}\n",
        r.converted, r.group_size, static_cast<double>(r.dense_bytes) / kMiB, static_cast<double>(r.int4_bytes) / kMiB,
        static_cast<double>(r.int4_bytes) / static_cast<double>(r.dense_bytes), output);
  } catch (const std::exception& e) {
    std::cerr << "mgbench quantize: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace mgbench::app
