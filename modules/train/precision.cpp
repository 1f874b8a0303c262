#include "train/precision.h"

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>

#include "core/option_table.h"

namespace mgbench::train {

namespace {

// clang-format off
constexpr PrecisionInfo kPrecisions[] = {
    // name       value                  help                                                        param          autocast autocast dtype  tf32  loss scaling
    {"fp64",     Precision::kFp64,    "the whole model and data in fp64",                          c10::kDouble,   false, c10::kFloat,    false, false},
    {"fp32",     Precision::kFp32,    "fp32, strict (TF32 off in cuBLAS and cuDNN)",               c10::kFloat,    false, c10::kFloat,    false, false},
    {"tf32",     Precision::kTf32,    "fp32 tensors, matmuls and convolutions on TF32 tensor cores", c10::kFloat,  false, c10::kFloat,    true,  false},
    {"fp16",     Precision::kFp16,    "the whole model and data in fp16 (the paper's half)",       c10::kHalf,     false, c10::kFloat,    false, false},
    {"bf16",     Precision::kBf16,    "the whole model and data in bf16 (TorchTune's dtype)",      c10::kBFloat16, false, c10::kFloat,    false, false},
    {"amp-fp16", Precision::kAmpFp16, "fp32 master weights, autocast to fp16, dynamic loss scaling", c10::kFloat,  true,  c10::kHalf,     false, true},
    {"amp-bf16", Precision::kAmpBf16, "fp32 master weights, autocast to bf16",                     c10::kFloat,    true,  c10::kBFloat16, false, false},
};
// clang-format on

}  // namespace

std::span<const PrecisionInfo> precision_choices() { return kPrecisions; }

const PrecisionInfo& precision_info(Precision p) { return options::row_of(precision_choices(), p); }

void apply_math_mode(const PrecisionInfo& p) {
  at::globalContext().setAllowTF32CuBLAS(p.tf32);
  at::globalContext().setAllowTF32CuDNN(p.tf32);
}

AutocastScope::AutocastScope(const PrecisionInfo& p, c10::DeviceType device_type) : device_type_(device_type) {
  if (!p.autocast) return;
  active_ = true;
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type);
  at::autocast::set_autocast_enabled(device_type, true);
  at::autocast::set_autocast_dtype(device_type, p.autocast_dtype);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}

}  // namespace mgbench::train
