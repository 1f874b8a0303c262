#pragma once
// The convert step of quantisation-aware training (torchao 0.11's
// Int8DynActInt4WeightQATQuantizer.convert): the linears a QAT run fake-quantised become real int4
// weights with their per-group scales, written as a safetensors checkpoint.
//
// Output directory layout (docs/quantization.md):
//   model.safetensors  for each converted linear <name>:
//                        <name>.qweight  uint8 [out, in / 2]: int4 two's complement, two per byte,
//                                        the even column in the high nibble (models::pack_int4)
//                        <name>.scales   float32 [out, in / group_size]
//                        <name>.zeros    float32 [out, in / group_size] (all 0: symmetric)
//                      every other tensor as in the input checkpoint (embeddings, norms, linears
//                      left dense), under Hugging Face's names; header metadata
//                      {"format": "pt", "quantization": "8da4w", "group_size": "<G>"};
//   config.json        the model's, with "quantization_config": {"quant_method": "8da4w",
//                      "group_size", "weight": "int4 symmetric per group", "activation": "int8
//                      asymmetric per token, dynamic", "modules": [...]};
//   qat_config.json    the QAT run's, as read.
// A weight is recovered as unpack_int4(qweight) * scales (repeated over each group); at inference
// the activations are quantised per token as in training (fake_quantize_per_token_int8).
#include <cstdint>
#include <ostream>
#include <string>

#include "core/option_table.h"

namespace mgbench::models {

struct QatConvertResult {
  std::int64_t converted = 0;    // linears converted to int4
  std::int64_t dense_bytes = 0;  // bytes of those linears' weights in the checkpoint's dtype
  std::int64_t int4_bytes = 0;   // bytes of their qweight, scales and zeros
  std::int64_t group_size = 0;
};

/// Converts a QAT-trained checkpoint. model_dir: a Hugging Face checkpoint (config.json +
/// safetensors) -- a `--recipe qat` run's --output-dir, or the base model of a qat-lora run whose
/// adapters are in adapter_dir (merged first: W + alpha / rank B A, TorchTune's
/// get_merged_lora_ckpt). qat_config.json ({"scheme": "8da4w", "group_size", "linears"}) is read
/// from adapter_dir when given, else model_dir. Throws DataError naming the file and field for a
/// missing or malformed qat_config.json, adapter or checkpoint, or a listed linear the model does
/// not have or the group does not divide; ConfigError for an output_dir that is model_dir or
/// adapter_dir (the trained weights would be overwritten by their int4 values) or holds a sharded
/// checkpoint's index (shadowing_index); I/O errors name the output file.
QatConvertResult convert_qat_checkpoint(const std::string& model_dir, const std::string& adapter_dir,
                                        const std::string& output_dir);

/// `mgbench quantize`'s options.
struct QuantizeOptions {
  /// --help's text above the options.
  static constexpr const char* kUsage =
      "mgbench quantize: convert what a QAT run trained (--recipe qat, or qat-lora) to int4 weights with per-group "
      "scales, as torchao's Int8DynActInt4WeightQATQuantizer.convert.\n"
      "usage: mgbench quantize --model DIR [--adapter DIR] --output DIR";

  std::string model;    // a qat run's --output-dir, or the base model of a qat-lora run
  std::string adapter;  // a qat-lora run's --output-dir ("": none)
  std::string output;   // the directory written

  void declare(options::OptionTable& table);
};

/// `mgbench quantize`: convert_qat_checkpoint, then one line on out saying what was converted and the
/// bytes before and after. Returns the exit code: 0, or 1 with the message on err.
int quantize(const QuantizeOptions& options, std::ostream& out, std::ostream& err);

}  // namespace mgbench::models
