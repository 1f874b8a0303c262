// `mgbench quantize`: a QAT-trained checkpoint's fake-quantised linears -> real int4 weights
// (torchao's convert; models/qat_convert.h and docs/quantization.md).
#include <iostream>

#include "commands.h"
#include "models/qat_convert.h"
#include "options.h"

namespace mgbench::app {

int quantize_main(int argc, char** argv) {
  models::QuantizeOptions options;
  options::OptionTable table;
  options.declare(table);
  const CommandSpec spec{
      "quantize",
      "mgbench quantize: convert what a QAT run trained (--recipe qat, or qat-lora) to int4 weights with per-group "
      "scales, as torchao's Int8DynActInt4WeightQATQuantizer.convert.\n"
      "usage: mgbench quantize --model DIR [--adapter DIR] --output DIR\noptions"};
  GeneralFlags flags;
  if (auto exit_code = parse_command(spec, table, argc, argv, flags)) return *exit_code;
  return models::quantize(options, std::cout, std::cerr);
}

}  // namespace mgbench::app
