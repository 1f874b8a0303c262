#include "axes/precision.h"

#include "core/option_table.h"

namespace mgbench::axes {
namespace {

constexpr DtypeInfo kDtypes[] = {
    {"fp32", Dtype::kFloat32, "float32 (nccl-tests: float)", 4},
    {"bf16", Dtype::kBFloat16, "bfloat16 (MPI: reduced as float32 on the host)", 2},
    {"fp16", Dtype::kFloat16, "float16 (nccl-tests: half; MPI: reduced as float32 on the host)", 2},
    {"fp64", Dtype::kFloat64, "float64 (nccl-tests: double)", 8},
};

constexpr Dtype f64 = Dtype::kFloat64, f32 = Dtype::kFloat32, f16 = Dtype::kFloat16, bf16 = Dtype::kBFloat16;

// clang-format off
constexpr PrecisionInfo kPrecisions[] = {
    // name       value                  help                                                        param autocast autocast dtype  tf32  loss scaling
    {"fp64",     Precision::kFp64,    "the whole model and data in fp64",                            f64,  false,   f32,            false, false},
    {"fp32",     Precision::kFp32,    "fp32, strict (TF32 off in cuBLAS and cuDNN)",                 f32,  false,   f32,            false, false},
    {"tf32",     Precision::kTf32,    "fp32 tensors, matmuls and convolutions on TF32 tensor cores", f32,  false,   f32,            true,  false},
    {"fp16",     Precision::kFp16,    "the whole model and data in fp16 (the paper's half)",         f16,  false,   f32,            false, false},
    {"bf16",     Precision::kBf16,    "the whole model and data in bf16 (TorchTune's dtype)",        bf16, false,   f32,            false, false},
    {"amp-fp16", Precision::kAmpFp16, "fp32 master weights, autocast to fp16, dynamic loss scaling", f32,  true,    f16,            false, true},
    {"amp-bf16", Precision::kAmpBf16, "fp32 master weights, autocast to bf16",                       f32,  true,    bf16,           false, false},
};
// clang-format on

}  // namespace

std::span<const DtypeInfo> dtype_choices() { return kDtypes; }
const DtypeInfo& dtype_info(Dtype d) { return options::row_of(dtype_choices(), d); }

std::span<const PrecisionInfo> precision_choices() { return kPrecisions; }
const PrecisionInfo& precision_info(Precision p) { return options::row_of(precision_choices(), p); }

const PrecisionInfo& find_precision(std::string_view option, std::string_view name) {
  return precision_info(options::parse_choice(precision_choices(), option, name));
}

}  // namespace mgbench::axes
